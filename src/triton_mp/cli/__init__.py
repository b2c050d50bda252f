"""The command line: ``triton-mp start`` (argv -> ServerConfig), ``stat``, model assets."""
