"""The python backend, laid out as Triton's python_backend ships it.

- ``backend``: ``PythonBackend``, runs a Triton ``model.py`` in a worker;
- ``pb_utils``: ``triton_python_backend_utils``, the API user models import (one module, as
  upstream ships it; installed into ``sys.modules`` under that name before ``model.py`` is
  imported);
- ``metrics``: the custom-metric store of ``pb_utils`` on this worker's shared-memory board;
- ``autocomplete``: the model's own ``auto_complete_config``, run in a throwaway child
  process for the model loader.

Importing the package runs no user code and loads none of these."""
