/*
 * onceflow: the id table behind IdStateStoreProvider (see that file).
 */
package org.apache.spark.sql.onceflow

import org.apache.spark.sql.catalyst.expressions.XXH64
import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.array.ByteArrayMethods

/**
 * The ids of one partition of a dedup-within-watermark operator: key bytes -> expiry (micros).
 *
 * Entries live in dense arrays (key bytes, 64-bit hash, expiry); an open-addressing index
 * (linear probing) maps a hash to an entry, each slot holding the hash's upper half beside the
 * entry number, so that a probe rarely touches an entry. A removal only marks its entry: an
 * eviction removes most entries of a batch at once, and rebuilding the index from the entries
 * left ([[compact]], before the next lookup) costs less than deleting each from the index.
 * Entries keep their numbers until then, so an iteration may remove as it goes.
 */
final class IdTable(initial: Int) {
  private var slots = new Array[Long](IdTable.capacityFor(initial))
  private var keys = new Array[Array[Byte]](math.max(initial, 16))
  private var hashes = new Array[Long](keys.length)
  private var values = new Array[Long](keys.length)
  private var dead = new Array[Boolean](keys.length)
  private var n = 0
  private var removed = 0
  private var generation = 0L

  /** Live entries. */
  def size: Int = n - removed
  /** Entry numbers in use (live or removed) until the next [[compact]]. */
  def extent: Int = n
  /** Changes when entries are renumbered (an iteration over numbers must not outlive it). */
  def epoch: Long = generation
  def isLive(e: Int): Boolean = !dead(e)
  def keyAt(e: Int): Array[Byte] = keys(e)
  def valueAt(e: Int): Long = values(e)

  /** The entry holding the key (bytes at base+off), or -1. */
  def find(h: Long, base: AnyRef, off: Long, len: Int): Int = {
    if (removed > 0) compact()
    val mask = slots.length - 1
    val tag = h >>> 32
    var i = h.toInt & mask
    while (true) {
      val s = slots(i)
      if (s == 0L) return -1
      if ((s >>> 32) == tag) {
        val e = (s & 0xffffffffL).toInt - 1
        val k = keys(e)
        if (hashes(e) == h && k.length == len && IdTable.sameBytes(k, base, off, len)) return e
      }
      i = (i + 1) & mask
    }
    -1
  }

  /** Adds a key known to be absent; `k` becomes the table's (not copied). */
  def add(h: Long, k: Array[Byte], v: Long): Unit = {
    if (removed > 0) compact()
    if ((n + 1) * 2 > slots.length) reindex(IdTable.capacityFor(n + 1))
    if (n == keys.length) {
      val c = keys.length * 2
      keys = java.util.Arrays.copyOf(keys, c); hashes = java.util.Arrays.copyOf(hashes, c)
      values = java.util.Arrays.copyOf(values, c); dead = java.util.Arrays.copyOf(dead, c)
    }
    keys(n) = k; hashes(n) = h; values(n) = v; dead(n) = false
    insertSlot(h, n)
    n += 1
  }

  /** Inserts or replaces. */
  def put(h: Long, k: Array[Byte], v: Long): Unit = {
    val e = find(h, k, IdTable.BYTES, k.length)
    if (e >= 0) values(e) = v else add(h, k, v)
  }

  def setValue(e: Int, v: Long): Unit = values(e) = v

  private def insertSlot(h: Long, e: Int): Unit = {
    val mask = slots.length - 1
    var i = h.toInt & mask
    while (slots(i) != 0L) i = (i + 1) & mask
    slots(i) = ((h >>> 32) << 32) | (e + 1L)
  }

  /** Marks entry `e` removed (it keeps its number until [[compact]]). */
  def removeAt(e: Int): Unit = if (!dead(e)) { dead(e) = true; removed += 1 }

  /** Drops removed entries, renumbers the rest and rebuilds the index. */
  def compact(): Unit = if (removed > 0) {
    var w = 0; var e = 0
    while (e < n) {
      if (!dead(e)) {
        keys(w) = keys(e); hashes(w) = hashes(e); values(w) = values(e); dead(w) = false
        w += 1
      }
      e += 1
    }
    java.util.Arrays.fill(keys.asInstanceOf[Array[AnyRef]], w, n, null)
    n = w; removed = 0; generation += 1
    reindex(IdTable.capacityFor(math.max(n, 8)))
  }

  private def reindex(cap: Int): Unit = {
    slots = new Array[Long](cap)
    var e = 0
    while (e < n) { insertSlot(hashes(e), e); e += 1 }
  }

  /** The smallest expiry of a live entry (Long.MaxValue when empty). */
  def minValue: Long = {
    var m = Long.MaxValue; var e = 0
    while (e < n) { if (!dead(e) && values(e) < m) m = values(e); e += 1 }
    m
  }

  /** Removes every entry whose expiry is <= t. */
  def evictUpTo(t: Long): Unit = {
    var e = 0
    while (e < n) { if (values(e) <= t) removeAt(e); e += 1 }
  }
}

object IdTable {
  val BYTES: Long = Platform.BYTE_ARRAY_OFFSET.toLong

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
  def record(op: Byte, k: Array[Byte], v: Long, withValue: Boolean): Unit = {
    room(13 + k.length)
    buf.put(op).putInt(k.length).put(k)
    if (withValue) buf.putLong(v)
  }
  /** A snapshot's entry: the key's length and bytes, then its value (no operation byte). */
  def entry(k: Array[Byte], v: Long): Unit = {
    room(12 + k.length)
    buf.putInt(k.length).put(k).putLong(v)
  }
  def array: Array[Byte] = buf.array()
}
