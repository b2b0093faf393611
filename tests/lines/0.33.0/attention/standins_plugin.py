"""pytest plugin: import vLLM from $SMLA_033_TREE with the toolkit's stand-ins (compiled modules,
CUDA platform with compute capability 8.6 mocked, no CUDA device), before any test module imports
vllm.  Used to run the series' GPU-free vLLM tests on this CPU machine:

  cd $SMLA_033_TREE && PYTHONPATH=<tree> \
  SMLA_STANDINS=tools/smla/_selection_standins.py \
  .venv-0.33.0/bin/python -m pytest -p standins_plugin --noconftest -q \
      tests/v1/attention/test_triton_mla_sparse.py
"""
import importlib.util
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
_spec = importlib.util.spec_from_file_location("_smla_selection_standins",
                                               os.environ["SMLA_STANDINS"])
_st = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _st
_spec.loader.exec_module(_st)
_st.import_vllm_tree(os.environ["SMLA_033_TREE"], capability="8.6")
