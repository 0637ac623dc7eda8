"""``make bench``: a fixed suite of side-by-side measurements (see ``bench/__main__.py``)."""
