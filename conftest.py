"""Collection rules for the whole repository, the doctests of ``lightning_hetero`` included."""

import importlib.util

# lightning_hetero.integrations.ray needs the `ray` extra (`make test-ray` installs it)
collect_ignore = []
if importlib.util.find_spec("ray") is None:
    collect_ignore.append("lightning_hetero/integrations/ray.py")
# the streaming end-to-end program imports LitData (the dev install adds it: see the Makefile)
if importlib.util.find_spec("litdata") is None:
    collect_ignore.append("tests/e2e/streaming_program.py")
