"""Deduplication by record id: the catalog of seen ids with rolling Bloom filters and a GC watermark."""

from onceflow.dedup.catalog import CatalogConfig, CatalogMetrics, DedupCatalog, Status

__all__ = ["CatalogConfig", "CatalogMetrics", "DedupCatalog", "Status"]
