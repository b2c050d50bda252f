"""The ONNX Runtime backend: ``autocomplete`` (the config from the graph, run by the model
loader). Importing the package loads neither onnx nor onnxruntime."""
