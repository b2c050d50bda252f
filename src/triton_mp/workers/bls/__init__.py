"""A python model's calls out of its worker: BLS requests to other models (``bls_client``,
``bls_readiness``) and ``pb_utils.load_model`` / ``unload_model`` (``model_control_client``).
"""
