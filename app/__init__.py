"""SpecDec Studio: see, teach and measure speculative decoding.

Importing the package loads no model and starts no server.
"""

__version__ = "0.1.0"
