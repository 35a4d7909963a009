"""Reports rendered from result JSON: self-contained HTML (inline CSS and SVG, no network)."""
