"""The frontend's non-inference APIs: health and metadata, repository control, statistics,
logging, and the control pipe to the supervisor.
"""
