"""Serve ppdlx exports with Triton Inference Server, WITHOUT ppdlx (ppdlx_deploy, paddle, numpy,
Pillow, PyYAML; ``tritonclient`` and the ``nvidia-pytriton`` wheel's server only where used):

* :mod:`.repository` (``deploy/triton/make_repo.py``): a model repository from an export directory,
  with :mod:`.config` writing each ``config.pbtxt``;
* :mod:`.serving` and ``model.py``: what the served models compute, and Triton's Python-backend model
  around it;
* :mod:`.server` (``deploy/triton/serve.py``): the bundled ``tritonserver`` on loopback ports;
* :mod:`.client`: image files to answers over HTTP or gRPC.
"""
