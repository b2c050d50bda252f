# syntax=docker/dockerfile:1
# triton-mp's container image (docs/deploy.md): the wheel of this checkout in a venv, the
# default model repository with its model files materialised at build time (read-only,
# at /models), a non-root user, Triton's three ports and a health check on readiness.
#
#   docker build -t triton-mp:0.1.0 .
#   docker run --rm --shm-size=1g -p 8000-8002:8000-8002 triton-mp:0.1.0
#
# GPU variant (docs/deploy.md, "GPU image"): the same file with a CUDA runtime base and the
# `gpu` extra:
#   docker build --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#                --build-arg EXTRAS=repository,gpu -t triton-mp:0.1.0-gpu .
#
# Four stages: `python` (the base with a Python that makes venvs), then `native` (the C++
# extension, with the compiler) and `venv` (the dependencies, the project, the model files;
# no compiler) side by side (BuildKit runs them at once; podman with --jobs=2), and the
# runtime stage, which takes only the venv, the extension, /models and the extension's
# shared libraries from them.
#
# Every command below is one that the tests run too (tests/deploy/test_dockerfile.py and
# tests/e2e/test_deploy_contract.py, which read them from this file): the
# wheel build and a server started from the wheel on a read-only repository, the asset
# install of the README's set-up command, and `python -m triton_mp.cli.assets`.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS python
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# NOTE: the slim Python base has venv already; a CUDA base (Ubuntu) or a Debian one gets the
# distribution's python3, whose version the distribution pins. `import ensurepip` is the check:
# Debian's python3 without python3-venv runs `python3 -m venv --help` but cannot make a venv.
# hadolint ignore=DL3008
RUN if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# The native extensions (built by setup.py): the gRPC frontend (frontend/native) compiles
# against the distribution's libgrpc++ and libprotobuf: a C++ compiler, pkg-config, protoc and
# their -dev packages (the list of the README's set-up command), and Python's
# headers where the base has none (a distribution's python3; the slim Python image has
# them); the REQUEST record decoder (ipc/native), the workers' answer writer and batch gather
# (workers/native; the gather also numpy's headers, which pip's isolated build brings from
# pyproject's build requirements) and the python backend's request objects
# (backends/python/native) need only Python's. Only setup.py, protos/
# and the extensions' own sources come in, so a change elsewhere in src/ does not compile
# them again. The project's build makes a wheel of the extensions alone (README.md is
# metadata only); their modules go into /native/site, laid out as the venv's site-packages,
# and /native/packages.txt names the distribution's packages that hold the shared libraries
# they link (libgrpc++, libprotobuf, ...), which the runtime stage installs.
FROM python AS native
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ pkg-config libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc \
    && if [ ! -f "$(python3 -c 'import sysconfig; print(sysconfig.get_path("include"))')/Python.h" ]; then \
         apt-get install -y --no-install-recommends python3-dev; \
       fi \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml ./
COPY setup.py ./
COPY protos ./protos
COPY src/triton_mp/frontend/native ./src/triton_mp/frontend/native
COPY src/triton_mp/ipc/native ./src/triton_mp/ipc/native
COPY src/triton_mp/ipc/records.h ./src/triton_mp/ipc/records.h
COPY src/triton_mp/workers/native ./src/triton_mp/workers/native
COPY src/triton_mp/backends/python/native ./src/triton_mp/backends/python/native
COPY src/triton_mp/scheduler/native ./src/triton_mp/scheduler/native
RUN touch README.md \
    && python3 -m venv /native/venv \
    && /native/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /native/wheel . \
    && /native/venv/bin/python -m zipfile --extract "$(echo /native/wheel/triton_mp-*.whl)" /native/tree \
    && modules=(/native/tree/triton_mp/frontend/native/_native*.so /native/tree/triton_mp/ipc/_request_decoder*.so /native/tree/triton_mp/workers/_answer_writer*.so /native/tree/triton_mp/workers/_batch_gather*.so /native/tree/triton_mp/backends/python/_pb_requests*.so /native/tree/triton_mp/backends/python/_pb_results*.so /native/tree/triton_mp/scheduler/_queue_records*.so) \
    && site="/native/site$(python3 -c 'import sys; print(f"/opt/triton-mp/lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages")')" \
    && for module in "${modules[@]}"; do \
         test -f "$module" || exit 1; \
         install -D "$module" "$site/${module#/native/tree/}"; \
       done \
    && ldd "${modules[@]}" | awk '$3 ~ /^\// {print "*/" $1}' | xargs dpkg -S | cut -d: -f1 | sort -u > /native/packages.txt

# The venv: no compiler here (every dependency is a wheel). The dependencies first, in a
# layer of their own that only a change to pyproject.toml rebuilds: pyproject's dependencies
# and those of the EXTRAS (an extra that names triton-mp itself is left out), as a
# requirements file.
FROM python AS venv
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG EXTRAS=repository
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -m venv /opt/triton-mp \
    && /opt/triton-mp/bin/pip install --no-cache-dir --upgrade "pip>=24" \
    && /opt/triton-mp/bin/python -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + [d for e in sys.argv[1].split(",") if e for d in p["optional-dependencies"][e] if not d.startswith(p["name"])]))' "${EXTRAS}" > /requirements.txt \
    && /opt/triton-mp/bin/pip install --no-cache-dir -r /requirements.txt
COPY README.md ./
COPY src ./src
RUN TRITON_MP_NATIVE=0 /opt/triton-mp/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && /opt/triton-mp/bin/pip install --no-cache-dir "$(echo /wheels/triton_mp-*.whl)[${EXTRAS}]"
# The model files ship inside two wheels that are needed only here (README, "Set up").
COPY model_repository /models
RUN /opt/triton-mp/bin/pip install --no-cache-dir --no-deps --ignore-requires-python rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3 \
    && /opt/triton-mp/bin/python -m triton_mp.cli.assets /models \
    && /opt/triton-mp/bin/pip uninstall -y rapidocr-onnxruntime silero-vad
# What the server never imports leaves the venv (about 110 MB; docs/deploy.md, "Image size"):
# the test suites and test data of numpy and onnx, numpy's f2py and distutils, onnxruntime's
# offline tools (transformer optimiser, quantisation, model conversion) and its C API
# library (libonnxruntime.so: the Python binding links ORT statically and never loads it),
# and pip and setuptools (the root file system is read-only, so nothing is installed at run
# time). Every model of /models loads without them (tests/e2e/test_container.py).
RUN site="$(/opt/triton-mp/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    && find "$site/numpy" -depth -type d -name tests -exec rm -rf {} + \
    && rm -rf "$site/numpy/f2py" "$site/numpy/distutils" "$site/onnx/backend/test" \
              "$site/onnxruntime/transformers" "$site/onnxruntime/quantization" \
              "$site/onnxruntime/tools" "$site/onnxruntime/datasets" \
    && rm -f "$site"/onnxruntime/capi/libonnxruntime.so.* \
    && /opt/triton-mp/bin/pip uninstall -y pip setuptools

FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The shared libraries of the native gRPC frontend (only those; no compiler, no headers).
COPY --from=native /native/packages.txt /tmp/native-packages.txt
# hadolint ignore=DL3008
RUN apt-get update \
    && if ! command -v python3 >/dev/null 2>&1; then \
         apt-get install -y --no-install-recommends python3; \
       fi \
    && xargs -a /tmp/native-packages.txt apt-get install -y --no-install-recommends \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /tmp/native-packages.txt \
    && (getent passwd 1000 >/dev/null || useradd --uid 1000 --user-group --no-create-home --shell /usr/sbin/nologin triton)
COPY --from=venv /opt/triton-mp /opt/triton-mp
COPY --from=native /native/site/ /
COPY --from=venv /models /models
ENV PATH=/opt/triton-mp/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# The build fails unless the extensions load beside the venv's code on the runtime libraries.
RUN python3 -c 'from triton_mp.frontend import native; assert native.available(), native.UNAVAILABLE' \
    && python3 -c 'from triton_mp.ipc import _request_decoder; from triton_mp.scheduler import _queue_records'
RUN python3 -c 'from triton_mp.workers import _answer_writer, _batch_gather; from triton_mp.backends.python import _pb_requests, _pb_results'
USER 1000:1000
WORKDIR /tmp
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4)"]
ENTRYPOINT ["triton-mp", "start"]
CMD ["--model-repository=/models"]
