"""Backends: the code that runs one model instance, one package per backend.

``registry`` holds the one table of backends triton-mp knows (``BACKENDS``): the loader, the
planner and the worker all read it. Adding a backend is a new ``backends/<name>/`` package
plus one ``BackendInfo`` row. This package imports no backend library at its top level.
"""
