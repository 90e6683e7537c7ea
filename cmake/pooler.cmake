# The Pooler, ExpertNorm and NVFP4 (issue 4): sources added to the library
# and to the benchmark library here.
