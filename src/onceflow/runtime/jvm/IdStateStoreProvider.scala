/*
 * onceflow: a state store for Spark's dropDuplicatesWithinWatermark.
 *
 * Built by onceflow.runtime.idstore (the Scala compiler PySpark ships, against the session's own Spark
 * jars) and named by onceflow.session() (its default; id_store=True) as
 * spark.sql.streaming.stateStore.providerClass.
 */
package org.apache.spark.sql.onceflow

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path

import org.apache.spark.TaskContext
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types.{LongType, StructType}
import org.apache.spark.unsafe.Platform

/**
 * A StateStoreProvider for Spark's `dropDuplicatesWithinWatermark` (key: the ids, value: one
 * `expiresAtMicros` long); every other operator's state goes to Spark's HDFS-backed provider.
 *
 * Commit protocol (one store, one partition, version v -> v + 1):
 *   1. getStore(v): the provider's table when it is at v and no other store holds it, else
 *      the table rebuilt from the files (the latest snapshot <= v, then each delta up to v).
 *   2. get/put/remove change the table and append to an operation log in memory.
 *   3. commit(): the log is written to `<v+1>.iddelta` through Spark's CheckpointFileManager
 *      (a temporary file renamed into place; a crash before the rename leaves no file, and
 *      Spark re-runs the batch on version v). Only after the rename is the table at v + 1.
 *      An eviction that removed every entry expiring at or before T is written as one record
 *      "evict up to T" instead of one record per id.
 *   4. abort() (a failed or killed task): a changed table is dropped; the next getStore
 *      rebuilds it from the files, so a half-applied batch never survives. An unchanged one
 *      (a read-only use) stays at v.
 *   5. doSnapshotMaintenance / doCleanupMaintenance (Spark's maintenance thread): a snapshot
 *      `<v>.idsnap` of a table not in use every `minDeltasForSnapshot` versions, and the files
 *      no longer needed to rebuild the last `minVersionsToRetain` versions deleted.
 * Every step may be repeated: a re-run of version v writes the same delta file again.
 */
class IdStateStoreProvider extends StateStoreProvider {
  import IdStateStoreProvider._

  @volatile private var id: StateStoreId = _
  private var conf: StateStoreConf = _
  private var hadoopConf: Configuration = _
  private var delegate: StateStoreProvider = _
  private var keyFields = 0
  private lazy val fm = CheckpointFileManager.create(id.storeCheckpointLocation(), hadoopConf)

  private var table: IdTable = _
  private var tableVersion: Long = -1L
  private var tableInUse = false
  private var lastSnapshot: Long = 0L

  override def init(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useColumnFamilies: Boolean,
      storeConfs: StateStoreConf,
      hadoopConf: Configuration,
      useMultipleValuesPerKey: Boolean,
      stateSchemaProvider: Option[StateSchemaProvider]): Unit = {
    this.id = stateStoreId
    this.conf = storeConfs
    this.hadoopConf = hadoopConf
    this.keyFields = keySchema.fields.length
    val ids = valueSchema.fields.length == 1 && valueSchema.fields(0).name == "expiresAtMicros" &&
      valueSchema.fields(0).dataType == LongType && !useColumnFamilies && !useMultipleValuesPerKey &&
      keyStateEncoderSpec.isInstanceOf[NoPrefixKeyStateEncoderSpec]
    if (!ids) {
      delegate = StateStoreProvider.create(HDFS_PROVIDER)
      delegate.init(stateStoreId, keySchema, valueSchema, keyStateEncoderSpec, useColumnFamilies,
        storeConfs, hadoopConf, useMultipleValuesPerKey, stateSchemaProvider)
    } else {
      fm.mkdirs(id.storeCheckpointLocation())
    }
  }

  override def stateStoreId: StateStoreId = id

  override def close(): Unit = {
    if (delegate != null) delegate.close()
    synchronized { table = null; tableVersion = -1L }
  }

  override def getStore( // spark>=4.2
      version: Long, // spark>=4.2
      uniqueId: Option[String], // spark>=4.2
      forceSnapshotOnCommit: Boolean, // spark>=4.2
      loadEmpty: Boolean): StateStore = // spark>=4.2
    if (delegate != null) delegate.getStore(version, uniqueId, forceSnapshotOnCommit, loadEmpty) // spark>=4.2
    else openStore(version, uniqueId) // spark>=4.2

  override def getStore(version: Long, uniqueId: Option[String]): StateStore = // spark<4.2
    if (delegate != null) delegate.getStore(version, uniqueId) else openStore(version, uniqueId) // spark<4.2

  private def openStore(version: Long, uniqueId: Option[String]): StateStore = {
    if (uniqueId.isDefined) {
      throw new IllegalStateException(
        "onceflow's id state store supports checkpoint format version 1 only " +
        "(spark.sql.streaming.stateStore.checkpointFormatVersion=1)")
    }
    if (version < 0) throw new IllegalArgumentException(s"state version $version < 0")
    val t = synchronized {
      if (table != null && tableVersion == version && !tableInUse) {
        tableInUse = true
        table
      } else {
        null
      }
    }
    if (t != null) new IdStore(version, t, owned = true) else {
      val loaded = load(version)
      val own = synchronized {
        if (!tableInUse) { table = loaded; tableVersion = version; tableInUse = true; true } else false
      }
      new IdStore(version, loaded, own)
    }
  }

  override def getReadStore(version: Long, uniqueId: Option[String]): ReadStateStore =
    if (delegate != null) delegate.getReadStore(version, uniqueId) else super.getReadStore(version, uniqueId)

  // Asked of a provider that was never initialised (an operator naming its metrics): Spark's
  // store's metrics, which a delegated store reports; the id store reports none of its own.
  override def supportedCustomMetrics: Seq[StateStoreCustomMetric] =
    StateStoreProvider.create(HDFS_PROVIDER).supportedCustomMetrics

  override def upgradeReadStoreToWriteStore(readStore: ReadStateStore, version: Long, // spark>=4.2
      uniqueId: Option[String], force: Boolean): StateStore = // spark>=4.2
    if (delegate == null) super.upgradeReadStoreToWriteStore(readStore, version, uniqueId, force) // spark>=4.2
    else delegate.upgradeReadStoreToWriteStore(readStore, version, uniqueId, force) // spark>=4.2

  override def upgradeReadStoreToWriteStore(readStore: ReadStateStore, version: Long, // spark<4.2
      uniqueId: Option[String]): StateStore = // spark<4.2
    if (delegate == null) super.upgradeReadStoreToWriteStore(readStore, version, uniqueId) // spark<4.2
    else delegate.upgradeReadStoreToWriteStore(readStore, version, uniqueId) // spark<4.2

  override def supportedInstanceMetrics: Seq[StateStoreInstanceMetric] =
    StateStoreProvider.create(HDFS_PROVIDER).supportedInstanceMetrics

  /** Step 5 (Spark 4.3's maintenance thread calls the two halves apart, both on unload). */
  override def doMaintenance(): Unit = {
    if (delegate != null) { delegate.doMaintenance(); return }
    snapshotMaintenance()
    cleanupMaintenance()
  }

  override def doSnapshotMaintenance(): Unit = // spark>=4.3
    if (delegate != null) delegate.doSnapshotMaintenance() else snapshotMaintenance() // spark>=4.3

  override def doCleanupMaintenance(): Unit = // spark>=4.3
    if (delegate != null) delegate.doCleanupMaintenance() else cleanupMaintenance() // spark>=4.3

  private def snapshotMaintenance(): Unit = {
    if (id == null) return
    // the entries serialized while no store holds the table; the file written after
    val snap = synchronized {
      if (table != null && !tableInUse && tableVersion - lastSnapshot >= conf.minDeltasForSnapshot) {
        (tableVersion, snapshotEntries(table))
      } else {
        null
      }
    }
    if (snap != null) {
      val (version, (count, entries)) = snap
      val head = java.nio.ByteBuffer.allocate(8).putInt(SNAPSHOT_MAGIC).putInt(count).array()
      writeAtomic(file(version, SNAPSHOT), (head, head.length), (entries.array, entries.position))
      lastSnapshot = version
    }
  }

  private def cleanupMaintenance(): Unit = if (id != null) cleanup()

  private def file(version: Long, kind: String): Path =
    new Path(id.storeCheckpointLocation(), s"$version.$kind")

  private def versions(): Seq[(Long, String)] = {
    val dir = id.storeCheckpointLocation()
    if (!fm.exists(dir)) return Nil
    fm.list(dir).toSeq.flatMap { st =>
      val name = st.getPath.getName
      val dot = name.indexOf('.')
      if (dot > 0 && (name.endsWith("." + DELTA) || name.endsWith("." + SNAPSHOT)) &&
          name.substring(0, dot).forall(_.isDigit)) {
        Some((name.substring(0, dot).toLong, name.substring(dot + 1)))
      } else {
        None
      }
    }
  }

  /** The table at `version`, from the latest snapshot at or below it and the deltas after. */
  private def load(version: Long): IdTable = {
    if (version == 0) return new IdTable(1 << 14)
    val all = versions()
    val snap = all.filter { case (v, k) => k == SNAPSHOT && v <= version }.map(_._1)
      .sorted.lastOption.getOrElse(0L)
    val t = if (snap > 0) damaged(file(snap, SNAPSHOT)) { readSnapshot(snap) } else new IdTable(1 << 14)
    var v = snap + 1
    while (v <= version) {
      val f = file(v, DELTA)
      if (!fm.exists(f)) {
        throw new IllegalStateException(s"onceflow id state store: $f is missing: the state of " +
          s"${id} cannot be rebuilt at version $version (restore the checkpoint's state directory)")
      }
      damaged(f) { readDelta(f, t) }
      v += 1
    }
    t
  }

  /** Runs `read` of file `f`; a file cut short or garbled is reported with its path and the remedy. */
  private def damaged[T](f: Path)(read: => T): T = {
    try read catch {
      case e @ (_: java.nio.BufferUnderflowException | _: IndexOutOfBoundsException) =>
        throw new IllegalStateException(s"onceflow id state store: $f is truncated or damaged " +
          s"(${e.getClass.getSimpleName}): the state of $id cannot be rebuilt from it; bring the " +
          "checkpoint's state directory back from a backup (or start over with a new checkpoint)", e)
    }
  }

  private def readAll(f: Path): java.nio.ByteBuffer = {
    val in = fm.open(f)
    try {
      val out = new java.io.ByteArrayOutputStream(1 << 20)
      val chunk = new Array[Byte](1 << 16)
      var r = in.read(chunk)
      while (r >= 0) { out.write(chunk, 0, r); r = in.read(chunk) }
      java.nio.ByteBuffer.wrap(out.toByteArray)
    } finally in.close()
  }

  private def readKey(b: java.nio.ByteBuffer): Array[Byte] = {
    val n = b.getInt()
    if (n < 0 || n > b.remaining()) throw new java.nio.BufferUnderflowException()  // a garbled length
    val k = new Array[Byte](n); b.get(k); k
  }

  private def readDelta(f: Path, t: IdTable): Unit = {
    val b = readAll(f)
    if (b.getInt() != DELTA_MAGIC) throw new IllegalStateException(s"$f is not an id delta file")
    var op = b.get()
    while (op != END) {
      op match {
        case PUT =>
          val k = readKey(b)
          t.put(IdTable.hash(k, IdTable.BYTES, k.length), k, IdTable.BYTES, k.length, b.getLong())
        case REMOVE =>
          val k = readKey(b)
          val e = t.find(IdTable.hash(k, IdTable.BYTES, k.length), k, IdTable.BYTES, k.length)
          if (e >= 0) t.removeAt(e)
        case EVICT => t.evictUpTo(b.getLong())
        case other => throw new IllegalStateException(s"$f: unknown record $other")
      }
      op = b.get()
    }
  }

  private def readSnapshot(version: Long): IdTable = {
    val f = file(version, SNAPSHOT)
    val b = readAll(f)
    if (b.getInt() != SNAPSHOT_MAGIC) throw new IllegalStateException(s"$f is not an id snapshot")
    val n = b.getInt()
    val t = new IdTable(n)
    var i = 0
    while (i < n) {
      val k = readKey(b)
      t.add(IdTable.hash(k, IdTable.BYTES, k.length), k, IdTable.BYTES, k.length, b.getLong())
      i += 1
    }
    t
  }

  private def writeAtomic(f: Path, parts: (Array[Byte], Int)*): Unit = {
    val raw = fm.createAtomic(f, true)
    try {
      parts.foreach { case (a, len) => raw.write(a, 0, len) }
      raw.close() // renamed into place here
    } catch {
      case e: Throwable => raw.cancel(); throw e
    }
  }

  /** The live entries of `t` as a snapshot's body, and how many. */
  private def snapshotEntries(t: IdTable): (Int, OpLog) = {
    val log = new OpLog
    var e = 0
    while (e < t.extent) {
      if (t.isLive(e)) log.entry(null, t.keyAddress(e), t.keyLength(e), t.valueAt(e))
      e += 1
    }
    (t.size, log)
  }

  /** Deletes files that no retained version (the last minVersionsToRetain) needs. */
  private def cleanup(): Unit = {
    val all = versions()
    if (all.isEmpty) return
    val latest = all.map(_._1).max
    val oldestKept = latest - conf.minVersionsToRetain + 1
    val base = all.filter { case (v, k) => k == SNAPSHOT && v <= oldestKept }.map(_._1).sorted.lastOption
    base.foreach { b =>
      all.foreach { case (v, k) => if (v < b || (v == b && k == DELTA)) fm.delete(file(v, k)) }
    }
  }

  /** One task's view of the table: version `version` until commit() makes it `version + 1`. */
  class IdStore(val version: Long, t: IdTable, owned: Boolean) extends StateStore {
    private val log = new OpLog
    private var firstRemove = -1 // where the log's first removal starts
    private var putAfterRemove = false
    private var removes = 0L
    private var maxRemoved = Long.MinValue
    @volatile private var state = 0 // 0 updating, 1 committed, 2 aborted
    private val valueRow = { val r = new UnsafeRow(1); r.pointTo(new Array[Byte](16), 16); r }
    private val iterKey = new UnsafeRow(keyFields)
    private val iterValue = { val r = new UnsafeRow(1); r.pointTo(new Array[Byte](16), 16); r }
    private var iterEntry = -1 // the entry the iterator last returned (its key row is iterKey)
    private var iterEpoch = -1L // the table's epoch then: iterKey's bytes are inside the table
    private val ownKey = new UnsafeRow(keyFields)
    private var ownBytes = new Array[Byte](64)
    // The key get() last found absent (copied into a reused buffer) and its hash: Spark's dedup
    // puts exactly that key next, which then needs neither a second hash nor a second probe
    // (forgotten at any other change).
    private var missKey = new Array[Byte](64)
    private var missLength = -1
    private var missHash = 0L

    Option(TaskContext.get()).foreach { ctx =>
      ctx.addTaskCompletionListener[Unit](_ => if (state == 0) abort()) // a failed task's store
    }

    override def id: StateStoreId = IdStateStoreProvider.this.id

    private def checkFamily(name: String): Unit = {
      if (name != StateStore.DEFAULT_COL_FAMILY_NAME) {
        throw new UnsupportedOperationException("onceflow's id state store has no column families")
      }
    }

    /** Whether `key` is the iterator's row for a live entry, numbered as when it was returned. */
    private def isIterated(key: UnsafeRow): Boolean =
      (key eq iterKey) && iterEntry >= 0 && t.epoch == iterEpoch && t.isLive(iterEntry)

    /**
     * `key`, or when it is the iterator's row (its bytes inside the table, where a compaction
     * or a grown arena moves them) a copy on the heap, taken before anything changes the table.
     */
    private def stable(key: UnsafeRow): UnsafeRow = {
      if (!(key eq iterKey)) return key
      if (t.epoch != iterEpoch) {
        throw new IllegalStateException(
          "onceflow's id state store: an iterator's row used after the table changed")
      }
      ownBytes = copied(key, ownBytes)
      ownKey.pointTo(ownBytes, key.getSizeInBytes)
      ownKey
    }

    /** `key`'s bytes copied into `buf` (a larger buffer when it does not fit): the buffer. */
    private def copied(key: UnsafeRow, buf: Array[Byte]): Array[Byte] = {
      val len = key.getSizeInBytes
      val to = if (buf.length < len) new Array[Byte](math.max(len, buf.length * 2)) else buf
      Platform.copyMemory(key.getBaseObject, key.getBaseOffset, to, IdTable.BYTES, len.toLong)
      to
    }

    private def entryOf(key: UnsafeRow): Int = {
      if (isIterated(key)) return iterEntry
      val k = stable(key)
      val h = IdTable.hash(k.getBaseObject, k.getBaseOffset, k.getSizeInBytes)
      t.find(h, k.getBaseObject, k.getBaseOffset, k.getSizeInBytes)
    }

    override def get(key0: UnsafeRow, colFamilyName: String): UnsafeRow = {
      if (isIterated(key0)) { valueRow.setLong(0, t.valueAt(iterEntry)); return valueRow }
      val key = stable(key0)
      val h = IdTable.hash(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
      val e = t.find(h, key.getBaseObject, key.getBaseOffset, key.getSizeInBytes)
      if (e >= 0) { valueRow.setLong(0, t.valueAt(e)); valueRow }
      else { remember(key, h); null }
    }

    private def remember(key: UnsafeRow, h: Long): Unit = {
      missKey = copied(key, missKey)
      missLength = key.getSizeInBytes
      missHash = h
    }

    override def put(key0: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = {
      if (state != 0) throw new IllegalStateException("put after commit or abort")
      val v = value.getLong(0)
      val key = if (isIterated(key0)) key0 else stable(key0)
      val base = key.getBaseObject
      val off = key.getBaseOffset
      val len = key.getSizeInBytes
      val missed = missLength == len && IdTable.sameBytes(missKey, base, off, len)
      missLength = -1
      if (missed) {
        t.add(missHash, base, off, len, v) // absent since get(): nothing changed the table in between
      } else {
        val e = entryOf(key)
        if (e >= 0) t.setValue(e, v) else t.add(IdTable.hash(base, off, len), base, off, len, v)
      }
      if (firstRemove >= 0) putAfterRemove = true
      log.record(PUT, base, off, len, v, withValue = true)
    }

    override def remove(key: UnsafeRow, colFamilyName: String): Unit = {
      if (state != 0) throw new IllegalStateException("remove after commit or abort")
      missLength = -1
      val e = entryOf(key)
      if (e >= 0) {
        val v = t.valueAt(e)
        if (firstRemove < 0) firstRemove = log.position
        log.record(REMOVE, null, t.keyAddress(e), t.keyLength(e), 0L, withValue = false)
        t.removeAt(e)
        removes += 1
        if (v > maxRemoved) maxRemoved = v
      }
    }

    override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
      checkFamily(colFamilyName)
      val pair = new UnsafeRowPair(iterKey, iterValue)
      // entries keep their numbers while removals only mark them (IdTable.compact renumbers)
      val it = new Iterator[UnsafeRowPair] {
        private val epoch = t.epoch
        private var pos = 0
        private def check(): Unit = if (t.epoch != epoch) {
          throw new IllegalStateException("onceflow's id state store changed under an iterator")
        }
        override def hasNext: Boolean = {
          check()
          while (pos < t.extent && !t.isLive(pos)) pos += 1
          pos < t.extent
        }
        override def next(): UnsafeRowPair = {
          if (!hasNext) throw new NoSuchElementException("no more state rows")
          iterKey.pointTo(null, t.keyAddress(pos), t.keyLength(pos)) // valid while the epoch is
          iterValue.setLong(0, t.valueAt(pos))
          iterEntry = pos
          iterEpoch = epoch
          pos += 1
          pair.withRows(iterKey, iterValue)
        }
      }
      new StateStoreIterator(it, () => { iterEntry = -1 })
    }

    override def commit(): Long = {
      if (state != 0) throw new IllegalStateException("commit after commit or abort")
      val end = java.nio.ByteBuffer.allocate(10)
      // puts first, then removals of every entry expiring at or before maxRemoved: one record
      val oneEviction = removes > 0 && !putAfterRemove && t.minValue > maxRemoved
      if (oneEviction) end.put(EVICT).putLong(maxRemoved)
      end.put(END)
      val head = java.nio.ByteBuffer.allocate(4).putInt(DELTA_MAGIC).array()
      try {
        writeAtomic(file(version + 1, DELTA), (head, 4),
          (log.array, if (oneEviction) firstRemove else log.position), (end.array, end.position()))
      } catch {
        case e: Throwable => abort(); throw e
      }
      state = 1
      t.compact() // here rather than in the next batch's first lookup
      t.releaseRetired() // no row of this store points into an outgrown arena any more
      if (conf.commitValidationEnabled) { // Spark checks that every partition's store committed
        StateStore.reportCommitToCoordinator(version + 1, id, hadoopConf)
      }
      IdStateStoreProvider.this.synchronized {
        if (owned && (table eq t)) { tableVersion = version + 1; tableInUse = false }
      }
      version + 1
    }

    override def abort(): Unit = {
      if (state == 0) {
        state = 2
        t.releaseRetired()
        val unchanged = log.position == 0 // e.g. a read-only use: the table is still version v
        IdStateStoreProvider.this.synchronized {
          if (owned && (table eq t)) {
            if (!unchanged) { table = null; tableVersion = -1L }
            tableInUse = false
          }
        }
      }
    }

    override def release(): Unit = abort()

    override def metrics: StateStoreMetrics =
      StateStoreMetrics(t.size.toLong, t.size.toLong * 64L, Map.empty)

    override def getStateStoreCheckpointInfo(): StateStoreCheckpointInfo =
      StateStoreCheckpointInfo(id.partitionId, version + 1, None, None)

    override def hasCommitted: Boolean = state == 1

    override def allColumnFamilyNames: Set[String] = Set(StateStore.DEFAULT_COL_FAMILY_NAME) // spark>=4.2

    private def unsupported(what: String): Nothing =
      throw new UnsupportedOperationException(s"onceflow's id state store does not support $what")

    override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
      unsupported("prefix scans")
    override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] =
      unsupported("several values per key")
    override def iteratorWithMultiValues(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = // spark>=4.2
      unsupported("several values per key") // spark>=4.2
    override def prefixScanWithMultiValues(prefixKey: UnsafeRow, // spark>=4.2
        colFamilyName: String): StateStoreIterator[UnsafeRowPair] = unsupported("several values per key") // spark>=4.2
    override def createColFamilyIfAbsent(name: String, keySchema: StructType, valueSchema: StructType,
        spec: KeyStateEncoderSpec, multi: Boolean, internal: Boolean): Unit = unsupported("column families")
    override def removeColFamilyIfExists(name: String): Boolean = unsupported("column families")
    override def putList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit =
      unsupported("putList")
    override def merge(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = unsupported("merge")
    override def mergeList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit =
      unsupported("mergeList")
  }
}

object IdStateStoreProvider {
  val HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
  val DELTA = "iddelta"
  val SNAPSHOT = "idsnap"
  val DELTA_MAGIC = 0x6f464431 // "oFD1"
  val SNAPSHOT_MAGIC = 0x6f465331 // "oFS1"
  val END: Byte = 0
  val PUT: Byte = 1
  val REMOVE: Byte = 2
  val EVICT: Byte = 3
}
