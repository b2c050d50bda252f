"""Pieces every process role shares: errors, datatypes, flags, logging, platform calls."""
