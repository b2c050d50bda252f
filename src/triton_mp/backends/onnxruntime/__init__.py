"""The ONNX Runtime backend: ``autocomplete`` (the config from the graph, run by the model
loader in the supervisor) and ``backend`` (``OnnxRuntimeBackend``, one ``InferenceSession``
per instance, run by a worker). Importing the package loads neither onnx nor onnxruntime."""
