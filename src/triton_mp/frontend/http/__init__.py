"""The HTTP/REST adapter of the frontend: KServe v2 routes and Triton's extensions over aiohttp
(``routes``), inference bodies (``infer_codec``) and their JSON tensor data (``json_tensors``)."""
