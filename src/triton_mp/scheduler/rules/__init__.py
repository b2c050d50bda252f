"""Triton's request rules as the scheduler applies them, pure: a request's admission as it
arrives (``admission``: its queue start, its errors' prefix, a version not served) and an
ensemble step's request as Triton's core builds and checks it (``step_inputs``).
"""
