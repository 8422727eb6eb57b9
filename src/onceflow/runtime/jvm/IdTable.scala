/*
 * onceflow: the id table behind IdStateStoreProvider (see that file).
 */
package org.apache.spark.sql.onceflow

import java.lang.ref.Cleaner

import org.apache.spark.sql.catalyst.expressions.XXH64
import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.array.ByteArrayMethods

/**
 * The ids of one partition of a dedup-within-watermark operator: key bytes -> expiry (micros).
 *
 * Everything lives outside the Java heap (three blocks, [[IdTable.Blocks]]), so the garbage
 * collector never copies a table's millions of ids from one survivor space to the next: entries
 * in a dense array of 32-byte records (hash, expiry, key offset, key length, removed flag), the
 * key bytes end to end in an arena, and an open-addressing index (linear probing) mapping a hash
 * to an entry, each slot holding the hash's upper half beside the entry number, so that a probe
 * rarely touches an entry. A removal only marks its entry: an eviction removes most entries of a
 * batch at once, and rebuilding the index from the entries left ([[compact]], before the next
 * lookup) costs less than deleting each from the index. Entries keep their numbers (and their
 * key addresses) until then, so an iteration may remove as it goes.
 *
 * The blocks are freed when the table becomes unreachable (a [[java.lang.ref.Cleaner]]), never
 * while anything can still read them; an outgrown index or entry array is freed once its
 * successor is in place, an outgrown key arena only at [[releaseRetired]] (the store's commit or
 * abort: until then a row may still point into it). One thread at a time uses a table (the
 * provider hands it to one store at a time).
 *
 * Most ids a batch looks up are new, and the index of a big table is far larger than a core's
 * cache: a lookup that probes it waits for memory, and Spark's deduplication cannot go on with
 * the row until it has the answer. So the index is fronted the way Dataflow fronts its id
 * catalog:
 *
 *   1. a blocked Bloom filter over the indexed entries (one 64-byte block per id, four bits in
 *      it; half a byte per index slot, so it stays in cache) answers "new" without touching the
 *      index — false only for ids it never saw, so an id it passes is certainly absent there;
 *   2. the entries added since the index was last brought up to date ([[PENDING_MAX]] at most)
 *      sit in a small index of their own, also in cache, which a lookup probes first;
 *   3. when that small index is full ([[add]]), and whenever the index is rebuilt ([[reindex]]),
 *      the pending entries go into the index and the filter in one loop, whose probes do not
 *      wait on one another.
 *
 * A lookup that the filter passes probes the index as before.
 */
final class IdTable(initial: Int) {
  import IdTable._

  private val mem = new Blocks
  CLEANER.register(this, mem)
  private var entryCap = math.max(initial, 16)
  private var slotCap = capacityFor(initial)
  private var arenaCap = entryCap.toLong * 16L
  // the blocks' addresses, read on every lookup (plain fields; `mem` keeps copies for the cleaner)
  private var entries = alloc(entryCap.toLong * ENTRY)
  private var slots = allocZeroed(slotCap.toLong * 8L)
  private var arena = alloc(arenaCap)
  private var blocks = filterBlocks(slotCap)
  private var filter = allocZeroed(blocks.toLong * 64L)
  private val pending = allocZeroed(PENDING_SLOTS * 8L)
  keep()
  private var arenaUsed = 0L
  private var n = 0
  /** Entries [0, indexed) are in the index and the filter; [indexed, n) only in `pending`. */
  private var indexed = 0
  private var removed = 0
  private var generation = 0L
  /** Where [[indexPending]]'s early reads go (a field: the compiler may not drop them). */
  private var sink = 0L

  /** Live entries. */
  def size: Int = n - removed
  /** Entry numbers in use (live or removed) until the next [[compact]]. */
  def extent: Int = n
  /**
   * Changes when entries are renumbered or key bytes move ([[compact]], the arena outgrown): an
   * iteration over numbers, or a row pointing at [[keyAddress]], must not outlive it.
   */
  def epoch: Long = generation
  private def at(e: Int): Long = entries + e.toLong * ENTRY
  def isLive(e: Int): Boolean = Platform.getInt(null, at(e) + 28) == 0
  def valueAt(e: Int): Long = Platform.getLong(null, at(e) + 8)
  private def hashAt(e: Int): Long = Platform.getLong(null, at(e))
  /** The address of entry `e`'s key bytes: valid while [[epoch]] stays the same. */
  def keyAddress(e: Int): Long = arena + Platform.getLong(null, at(e) + 16)
  def keyLength(e: Int): Int = Platform.getInt(null, at(e) + 24)

  private def keep(): Unit = mem.keep(entries, slots, arena, filter, pending)

  /** The entry holding the key (bytes at base+off), or -1. */
  def find(h: Long, base: AnyRef, off: Long, len: Int): Int = {
    if (removed > 0) compact()
    if (n > indexed) {
      val e = probe(pending, PENDING_SLOTS - 1, h, base, off, len)
      if (e >= 0) return e
    }
    if (!mayHold(h)) return -1
    probe(slots, slotCap - 1, h, base, off, len)
  }

  /** The entry of the key in the index at `block` (slots `mask` + 1), or -1. */
  private def probe(block: Long, mask: Int, h: Long, base: AnyRef, off: Long, len: Int): Int = {
    val tag = h >>> 32
    var i = h.toInt & mask
    while (true) {
      val s = Platform.getLong(null, block + i.toLong * 8L)
      if (s == 0L) return -1
      if ((s >>> 32) == tag) {
        val e = (s & 0xffffffffL).toInt - 1
        if (hashAt(e) == h && keyLength(e) == len &&
            ByteArrayMethods.arrayEquals(null, keyAddress(e), base, off, len.toLong)) return e
      }
      i = (i + 1) & mask
    }
    -1
  }

  /** Adds a key known to be absent (its bytes at base+off are copied). */
  def add(h: Long, base: AnyRef, off: Long, len: Int, v: Long): Unit = {
    if (removed > 0) compact()
    if ((n + 1) * 2 > slotCap) reindex(capacityFor(n + 1))
    if (n == entryCap) {
      entryCap *= 2
      entries = Platform.reallocateMemory(entries, n.toLong * ENTRY, entryCap.toLong * ENTRY)
      keep()
    }
    if (arenaUsed + len > arenaCap) { // the old arena kept until releaseRetired: a row may point there
      val c = math.max(arenaCap * 2, arenaUsed + len)
      val fresh = alloc(c)
      Platform.copyMemory(null, arena, null, fresh, arenaUsed)
      mem.retire(arena)
      arena = fresh
      arenaCap = c
      generation += 1
      keep()
    }
    Platform.copyMemory(base, off, null, arena + arenaUsed, len.toLong)
    val a = at(n)
    Platform.putLong(null, a, h)
    Platform.putLong(null, a + 8, v)
    Platform.putLong(null, a + 16, arenaUsed)
    Platform.putInt(null, a + 24, len)
    Platform.putInt(null, a + 28, 0)
    arenaUsed += len
    insertInto(pending, PENDING_SLOTS - 1, h, n)
    n += 1
    if (n - indexed >= PENDING_MAX) indexPending()
  }

  /** Inserts or replaces. */
  def put(h: Long, base: AnyRef, off: Long, len: Int, v: Long): Unit = {
    val e = find(h, base, off, len)
    if (e >= 0) setValue(e, v) else add(h, base, off, len, v)
  }

  def setValue(e: Int, v: Long): Unit = Platform.putLong(null, at(e) + 8, v)

  private def insertInto(block: Long, mask: Int, h: Long, e: Int): Unit = {
    var i = h.toInt & mask
    while (Platform.getLong(null, block + i.toLong * 8L) != 0L) i = (i + 1) & mask
    Platform.putLong(null, block + i.toLong * 8L, ((h >>> 32) << 32) | (e + 1L))
  }

  /** The filter's block of hash `h` and the hash's bits in it (four 9-bit positions). */
  private def mix(h: Long): Long = h * 0x9E3779B97F4A7C15L
  private def blockOf(g: Long): Long = filter + (((g >>> 40).toInt & (blocks - 1)).toLong << 6)
  private def word(b: Long, p: Long): Long = b + (((p >>> 6) & 7L) << 3)

  /** False: no indexed entry has hash `h` (the filter never gives false for one that has). */
  private def mayHold(h: Long): Boolean = {
    val g = mix(h)
    val b = blockOf(g)
    var k = 0
    while (k < 4) {
      val p = g >>> (9 * k)
      if ((Platform.getLong(null, word(b, p)) & (1L << (p & 63))) == 0L) return false
      k += 1
    }
    true
  }

  /** Entry `e` (hash `h`) into the index and the filter. */
  private def index(h: Long, e: Int): Unit = {
    insertInto(slots, slotCap - 1, h, e)
    val g = mix(h)
    val b = blockOf(g)
    var k = 0
    while (k < 4) {
      val p = g >>> (9 * k)
      val w = word(b, p)
      Platform.putLong(null, w, Platform.getLong(null, w) | (1L << (p & 63)))
      k += 1
    }
  }

  /** Step 3 of the class doc: the pending entries into the index and the filter. */
  private def indexPending(): Unit = {
    val mask = slotCap - 1
    var e = indexed
    var touched = 0L
    while (e < n) {
      // the slot of the entry AHEAD entries on is read now, so that its cache miss overlaps this
      // insert's instead of stalling the insert that needs it
      if (e + AHEAD < n) touched ^= Platform.getLong(null, slots + ((hashAt(e + AHEAD).toInt & mask).toLong << 3))
      index(hashAt(e), e)
      e += 1
    }
    sink = touched
    indexed = n
    Platform.setMemory(pending, 0.toByte, PENDING_SLOTS.toLong * 8L)
  }

  /** Marks entry `e` removed (it keeps its number until [[compact]]). */
  def removeAt(e: Int): Unit = if (isLive(e)) { Platform.putInt(null, at(e) + 28, 1); removed += 1 }

  /** Drops removed entries, renumbers the rest (keys moved down the arena) and rebuilds the index. */
  def compact(): Unit = if (removed > 0) {
    var w = 0; var e = 0; var used = 0L
    while (e < n) {
      if (isLive(e)) {
        val len = keyLength(e)
        val from = Platform.getLong(null, at(e) + 16)
        if (from != used) Platform.copyMemory(null, arena + from, null, arena + used, len.toLong)
        if (w != e) Platform.copyMemory(null, at(e), null, at(w), ENTRY)
        Platform.putLong(null, at(w) + 16, used)
        used += len
        w += 1
      }
      e += 1
    }
    n = w; removed = 0; arenaUsed = used; generation += 1
    // the index keeps its size: the next batch adds about as many ids as the eviction removed
    reindex(math.max(slotCap, capacityFor(math.max(n, 8))))
  }

  /** The index and the filter rebuilt for `cap` slots from every entry (none pending after). */
  private def reindex(cap: Int): Unit = {
    if (cap == slotCap) { // the same blocks, cleared: no fresh pages to fault in
      Platform.setMemory(slots, 0.toByte, cap.toLong * 8L)
      Platform.setMemory(filter, 0.toByte, blocks.toLong * 64L)
    } else {
      val (oldSlots, oldFilter) = (slots, filter)
      slots = allocZeroed(cap.toLong * 8L)
      slotCap = cap
      blocks = filterBlocks(cap)
      filter = allocZeroed(blocks.toLong * 64L)
      keep()
      Platform.freeMemory(oldSlots)
      Platform.freeMemory(oldFilter)
    }
    indexed = 0
    indexPending()
  }

  /** Frees the arenas outgrown since the last call (no row may point into them any more). */
  def releaseRetired(): Unit = mem.releaseRetired()

  /** The smallest expiry of a live entry (Long.MaxValue when empty). */
  def minValue: Long = {
    var m = Long.MaxValue; var e = 0
    while (e < n) {
      if (isLive(e)) { val v = valueAt(e); if (v < m) m = v }
      e += 1
    }
    m
  }

  /** Removes every entry whose expiry is <= t. */
  def evictUpTo(t: Long): Unit = {
    var e = 0
    while (e < n) { if (valueAt(e) <= t) removeAt(e); e += 1 }
  }
}

object IdTable {
  val BYTES: Long = Platform.BYTE_ARRAY_OFFSET.toLong
  /** Bytes of an entry: hash (8), expiry (8), key offset in the arena (8), key length (4), removed (4). */
  private val ENTRY = 32L
  private val CLEANER = Cleaner.create()

  /** A table's memory blocks (addresses), freed by the cleaner once the table is unreachable. */
  private final class Blocks extends Runnable {
    @volatile private var live = Array.empty[Long]
    private val retired = new java.util.ArrayList[java.lang.Long]
    def keep(blocks: Long*): Unit = live = blocks.toArray
    def retire(a: Long): Unit = retired.synchronized { retired.add(a) }
    def releaseRetired(): Unit = retired.synchronized {
      retired.forEach(a => Platform.freeMemory(a))
      retired.clear()
    }
    override def run(): Unit = {
      releaseRetired()
      live.foreach(a => if (a != 0L) Platform.freeMemory(a))
      live = Array.empty[Long]
    }
  }

  private def alloc(bytes: Long): Long = Platform.allocateMemory(math.max(bytes, 8L))

  private def allocZeroed(bytes: Long): Long = {
    val a = alloc(bytes)
    Platform.setMemory(a, 0.toByte, math.max(bytes, 8L))
    a
  }

  /** Entries added before the pending ones go into the index (step 2 of the class doc). */
  val PENDING_MAX = 16384
  /** How many entries ahead [[indexPending]] reads the slot an insert will need. */
  private val AHEAD = 16
  /** Slots of the pending entries' index (256 KB). */
  private val PENDING_SLOTS: Int = 2 * PENDING_MAX

  /** Blocks of 64 bytes in the filter of an index of `slots` slots: half a byte per slot. */
  private def filterBlocks(slots: Int): Int = math.max(1, slots / 128)

  def capacityFor(n: Int): Int = {
    var c = 16
    while (c < n * 2) c <<= 1
    c
  }

  def hash(base: AnyRef, off: Long, len: Int): Long = XXH64.hashUnsafeBytes(base, off, len, 0x6f6e6365L)

  def sameBytes(a: Array[Byte], base: AnyRef, off: Long, len: Int): Boolean =
    ByteArrayMethods.arrayEquals(a, BYTES, base, off, len.toLong)
}

/** Records appended to a growing byte array (big-endian, as DataInputStream reads them). */
final class OpLog {
  private var buf = java.nio.ByteBuffer.allocate(1 << 16)
  def position: Int = buf.position()
  private def room(k: Int): Unit = if (buf.remaining() < k) {
    val b = java.nio.ByteBuffer.allocate(math.max(buf.capacity() * 2, buf.position() + k))
    buf.flip(); b.put(buf); buf = b
  }
  private def putBytes(base: AnyRef, off: Long, len: Int): Unit = {
    Platform.copyMemory(base, off, buf.array, IdTable.BYTES + buf.position(), len.toLong)
    buf.position(buf.position() + len)
  }
  /** A record: operation, the key's length and bytes (at base+off), then (with `withValue`) v. */
  def record(op: Byte, base: AnyRef, off: Long, len: Int, v: Long, withValue: Boolean): Unit = {
    room(13 + len)
    buf.put(op).putInt(len)
    putBytes(base, off, len)
    if (withValue) buf.putLong(v)
  }
  /** A snapshot's entry: the key's length and bytes, then its value (no operation byte). */
  def entry(base: AnyRef, off: Long, len: Int, v: Long): Unit = {
    room(12 + len)
    buf.putInt(len)
    putBytes(base, off, len)
    buf.putLong(v)
  }
  def array: Array[Byte] = buf.array()
}
