"""Where the services keep what they produce: a floor below them, beside ``ldpipe.infra.runtime``.

* ``sketch_store`` — the sketch store (sealed window sketches and the offsets they cover, a
  Delta Lake table per use case; ``schemas/store.md``), opened from a use case with
  :func:`~ldpipe.infra.storage.sketch_store.open_sketch_store`; ``segments`` — its rows;
* ``discovery_store`` — the discoveries store (one Parquet file per released window;
  ``schemas/discovery.md``), opened with
  :func:`~ldpipe.infra.storage.discovery_store.open_discovery_store`;
* ``protocol`` — what the services call on a sketch store (:class:`SegmentReader`,
  :class:`SegmentStore`): they depend on these, not on the Delta class;
* ``engine`` — what the command line may know of the table engine (delta-rs) without importing
  it: whether it is loaded, which of its errors mean a damaged store;
* ``disk`` — a full, over-quota or read-only disk under any file a service writes, as one line
  naming the path and the fix (:class:`DiskFullError`), and the atomic write every writer uses.

Only ``sketch_store`` speaks to delta-rs; its failures come out as ``StoreError`` subclasses.
"""
