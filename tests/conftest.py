import os

# Several gloo ranks share two cores in the end-to-end tests.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: reproducible (derandomized) and without per-example deadlines, which
# shared CI cores would trip. HYPOTHESIS_PROFILE=thorough draws more examples.
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
