"""Tensors into and out of a worker: inputs read from the arenas and outputs written to this
worker's arena or the clients' regions (``tensor_io``), one batch's answer (``answer_batch``)
and the answer's size bound (``answer_size``).
"""
