"""The python backend: ``autocomplete`` (the model's own ``auto_complete_config``, run in a
throwaway child process for the model loader). Importing the package runs no user code."""
