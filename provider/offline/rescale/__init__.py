"""Rescale a stopped query's keyedstate checkpoint to a new partition count, Flink-style.

Spark freezes a stateful query at the partition count of its first batch (the offset log
records ``spark.sql.shuffle.partitions``). Spark 4.2's offline repartition rereads all state
through the state data source, shuffles it and rewrites it, and only for its own RocksDB
provider. keyedstate moves key groups instead: every stored key starts with its key group, so a
new partition's state is the key groups it owns, cut out of the old partitions' RocksDB
snapshots in key order and ingested as SST files, with no shuffle and no decoding of rows.

What is written follows Spark's own repartition, so that Spark treats the result (and any
interrupted attempt) exactly as it treats its own:

1. ``offsets/B`` (B = last committed batch + 1): a copy of the last committed entry with only
   ``spark.sql.shuffle.partitions`` changed -- a "repartition batch". Until step 4, a restart is
   refused by Spark with STREAMING_UNFINISHED_REPARTITION_DETECTED, so nothing half-done runs.
2. *split* (a Spark job, one task per old store partition): rebuild the committed version, scan
   it once, write each key to an SST file for the new partition that owns it (its key group
   mod N when N divides the key-group count, else Spark's Murmur3 partition hash of the key).
3. *merge* (one task per new store partition): ingest its SST files into an empty RocksDB and
   stage it as snapshot version B + 1 of that partition; once every task has succeeded, the
   driver moves the staged snapshots into the partitions (files, then the manifest). Tasks
   write only into this run's staging directory, which a rollback moves away first: a task of
   a failed job that is still running (an executor that never got the kill) cannot publish.
4. ``commits/B``: a copy of the last commit; from now on the query runs with N partitions.
   Just before it, each operator's metadata (``state/<op>/_metadata/metadata``, v1) is given
   the count N, as a query started with N writes it: Spark's state-metadata source reads it
   there (Spark's own writer never replaces the file, nor does its repartition for v1).

A scale-up by a multiple (N = k x the old count, both dividing the key-group count) needs no
merge: new partition q's keys all sit in old partition q mod the old count, so each split task
stages its k heirs itself: from its snapshot's files, shared and clipped (:mod:`.clip`), in
worker processes of the driver (:mod:`.local_workers`: the work is a few files per heir, less
than starting PySpark's workers); without a snapshot, by routing its changelogs.

Everything before the commit only adds files, so an interrupted rescale can be rerun (finished
splits are reused) or rolled back (:func:`rescale` with ``rollback=True``); the old state is
never modified. Old partitions beyond N are left on disk, as Spark's repartition leaves them.
Spark's logs are read and written through Spark's own ``OffsetSeqLog``/``CommitLog`` classes.

The package's modules: :mod:`.driver` (:func:`rescale` and the four steps), :mod:`.sparklogs`
(Spark's logs adapter), :mod:`.plan` (what is read before anything is written),
:mod:`.staging` (the work directory and journal), :mod:`.tasks` (the split task),
:mod:`.routing` (keys into the heirs' SST files), :mod:`.clip` (the split by files),
:mod:`.counts_through` (key-group counts carried through changelogs a split by files cuts),
:mod:`.local_workers` (tasks in the driver's processes), :mod:`.merge` (the merge task),
:mod:`.commit` (publishing the new partitions) and :mod:`.rollback`.
"""
from .driver import RescaleResult, refuse_checkpoint_format_2, rescale
from .errors import RescaleError

__all__ = ["RescaleError", "RescaleResult", "refuse_checkpoint_format_2", "rescale"]
