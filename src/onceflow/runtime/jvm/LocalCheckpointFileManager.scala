/*
 * onceflow: how Spark writes a checkpoint's files on a local file system.
 *
 * Built by onceflow.runtime.session (the Scala compiler PySpark ships, against the session's own Spark
 * jars) and named by onceflow.session() as spark.sql.streaming.checkpointFileManagerClass.
 */
package org.apache.spark.sql.onceflow

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileStatus, FSDataInputStream, LocalFileSystem, Path, PathFilter, RawLocalFileSystem}

import org.apache.spark.sql.execution.streaming.checkpointing.{CheckpointFileManager, FileSystemBasedCheckpointFileManager}
import org.apache.spark.sql.internal.SQLConf

/**
 * Spark's checkpoint file manager for a path, with local paths written through Hadoop's
 * FileSystem API instead of its FileContext API.
 *
 * Spark writes every checkpoint file (offset and commit logs, a file source's log, state store
 * deltas and snapshots) as a temporary file renamed into place, and by default through
 * FileContext. On a local file system without Hadoop's native library (a pip-installed
 * PySpark), FileContext's rename resolves links by running `readlink` in child processes
 * (four per rename): ~12 ms of a ~14 ms write, three writes per micro-batch on the driver's
 * critical path.
 * Spark's FileSystemBasedCheckpointFileManager renames with the same rename(2) system call,
 * which replaces the target atomically on a local file system: ~3 ms per write.
 *
 * Which manager a path gets:
 *   1. its file system (Hadoop's, from the path and the configuration) is local (Hadoop's
 *      LocalFileSystem or RawLocalFileSystem): Spark's FileSystemBasedCheckpointFileManager;
 *   2. any other (HDFS, object stores): whatever Spark chooses when this class is not named
 *      (CheckpointFileManager.create with the configuration key unset), unchanged.
 * The files written are the same files either way (names, contents, temporary names
 * `.<name>.<uuid>.tmp`): a checkpoint written with one is read and continued with the other.
 */
class LocalCheckpointFileManager(path: Path, hadoopConf: Configuration) extends CheckpointFileManager {
  private val delegate: CheckpointFileManager = path.getFileSystem(hadoopConf) match {
    case _: LocalFileSystem | _: RawLocalFileSystem =>
      new FileSystemBasedCheckpointFileManager(path, hadoopConf)
    case _ =>
      val sparks = new Configuration(hadoopConf)
      sparks.unset(SQLConf.STREAMING_CHECKPOINT_FILE_MANAGER_CLASS.parent.key)  // the key Spark reads
      CheckpointFileManager.create(path, sparks)
  }

  /** The manager this one writes through (for tests and diagnostics). */
  def writer: CheckpointFileManager = delegate

  override def createAtomic(
      p: Path, overwriteIfPossible: Boolean): CheckpointFileManager.CancellableFSDataOutputStream =
    delegate.createAtomic(p, overwriteIfPossible)

  override def open(p: Path): FSDataInputStream = delegate.open(p)

  override def list(p: Path, filter: PathFilter): Array[FileStatus] = delegate.list(p, filter)

  override def list(p: Path): Array[FileStatus] = delegate.list(p)

  override def mkdirs(p: Path): Unit = delegate.mkdirs(p)

  override def exists(p: Path): Boolean = delegate.exists(p)

  override def delete(p: Path): Unit = delegate.delete(p)

  override def isLocal: Boolean = delegate.isLocal

  override def createCheckpointDirectory(): Path = delegate.createCheckpointDirectory()

  override def close(): Unit = delegate.close()
}

object LocalCheckpointFileManager {
  /** A static member a Spark Connect client reflects on to learn whether the server has this class. */
  val NAME = "onceflow-checkpoint"
}
