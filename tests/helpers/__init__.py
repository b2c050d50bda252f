"""What the tests share: starting and stopping servers (``server``), model repositories
(``repos``), the real Triton beside us (``triton_peer``), models and inputs some tests
build (``ensemble_models``, ``python_api_models``, ``python_control_models``, ``torch_models``,
``ocr_images``, ``vad``, ``sequence_worker``) and the docs' fenced blocks (``docs_blocks``).
No tests live here."""
