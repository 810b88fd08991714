"""Serving bundles: assembled from a nominated arm, checked by reloading them as a server would."""
