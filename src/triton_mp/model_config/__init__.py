"""Model configuration: from a directory on disk to the runtime specs of its versions.

Mirrors Triton core's split (``model_config_utils.cc``, ``model_lifecycle.cc``,
``model_repository_manager.cc``); see ``shared/reference/triton.md`` §3 and §4.1-4.3:

- ``loader``: scan a repository, read ``config.pbtxt`` or a load's config override, run the
  steps below in Triton's order, choose version directories (version policy), fingerprint
  directories for rescans;
- ``autocomplete``: the server-side fields (name, backend, platform, default file name);
  the backend-side auto-complete is the backend registry's hook (``backends.registry``);
- ``normalize``: Triton's defaults, and default instance groups;
- ``validate``: model, input/output and instance-group rules;
- ``ensemble``: the step graph of one ensemble, and dependencies/cycles between ensembles;
- ``plan``: loaded models -> ``ipc.protocol.specs`` version specs and instances.

Imported by the supervisor (and the CLI); starts no process (except a python model's
auto-complete child) and touches no global state. Triton's JSON form of a config lives in
``common.json_form`` (the HTTP frontend and the python backend need it too).
"""
