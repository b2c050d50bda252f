"""The hot path's fixed-layout binary records (``record_layout``, ``records``,
``request_records``, ``answer_records``; their C twin is ``ipc/records.h``, read by
``ipc/native/request_decoder.cc``) and ``codec``, which writes a message as a record where
one exists and as msgpack otherwise. Uses ``ipc.protocol`` for the types it carries.
"""
