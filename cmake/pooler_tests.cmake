# Tests of the Pooler, ExpertNorm and NVFP4 (issue 4).
