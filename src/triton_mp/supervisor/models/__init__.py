"""Model control: loading, reloading and unloading models while the server serves (Triton's
model repository API, ``--load-model``, ``pb_utils.load_model``). Uses
``supervisor.processes`` to start and stop instances; never imported by it.
"""
