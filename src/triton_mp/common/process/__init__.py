"""How a process of the server runs: its title and parent-death signal (``platform``), the
GPUs it sees (``gpus``), Triton's host policy (``host_policy``), the process tree
(``proc_tree``), its directories
(``process_dirs``) and its logging (``log``).
Uses ``common``'s own modules (errors); they never import it.
"""
