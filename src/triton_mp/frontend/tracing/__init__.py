"""Request tracing: sampling and trace files, the settings served at run time, OpenTelemetry
export.
"""
