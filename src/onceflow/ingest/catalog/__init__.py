"""Deduplication by record id: the catalog of seen ids with rolling Bloom filters and a GC watermark."""

from onceflow.ingest.catalog.catalog import CatalogConfig, CatalogMetrics, DedupCatalog, Status

__all__ = ["CatalogConfig", "CatalogMetrics", "DedupCatalog", "Status"]
