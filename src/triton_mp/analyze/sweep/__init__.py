"""The sweep's pure pieces: the configurations to try, what each measurement found, the
user's constraints and objectives, the search, its settings and its checkpoint. Nothing here
starts a process or talks to the server.
"""
