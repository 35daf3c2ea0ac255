"""Web UI pieces: pure trace-to-HTML and trace-to-figure builders, and the Learn texts."""
