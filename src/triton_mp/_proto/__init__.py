"""Generated code, do not edit: regenerate with scripts/gen_protos.py (protos/*.proto is the source)."""
