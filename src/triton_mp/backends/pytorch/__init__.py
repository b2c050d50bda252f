"""The PyTorch backend (``backend: "pytorch"``, ``platform: "pytorch_libtorch"``): TorchScript
``model.pt`` files, as Triton's pytorch_backend (libtorch) serves them.

``backend`` runs one module per instance (worker processes only; imports torch), ``naming``
and ``parameters`` are its pure rules, ``autocomplete`` is the loader's hook (it imports no
torch). torch is the optional extra ``torch``; without it a PyTorch model fails to load with a
message saying so.
"""
