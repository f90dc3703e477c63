import os

# Several gloo ranks share two cores in the end-to-end tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")
