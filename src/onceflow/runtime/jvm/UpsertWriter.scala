/*
 * onceflow: a JVM ForeachWriter for Spark's Real-Time Mode, upserting each record into one
 * PostgreSQL table as it arrives.
 *
 * Built by onceflow.api.realtime (the Scala compiler PySpark ships, against the session's own
 * Spark jars); the PostgreSQL JDBC driver comes from `onceflow jars fetch postgres-jdbc`.
 */
package org.apache.spark.sql.onceflow

import java.sql.{Connection, DriverManager, PreparedStatement, SQLException, Timestamp}
import java.time.{Instant, ZoneOffset}
import java.util.Properties

import org.apache.spark.sql.{ForeachWriter, Row}
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema
import org.apache.spark.sql.types.StructType

/**
 * Writes every row of a stateless streaming query to one PostgreSQL table with
 * `INSERT ... ON CONFLICT (key) DO UPDATE` (or `DO NOTHING` when every column is key), one
 * autocommitted statement per row: a row is visible once its statement returns.
 *
 * Why a replay writes nothing twice: Spark's Real-Time Mode logs each batch's end offsets when
 * the batch (the trigger's duration) ends; a crash replays the records after the last logged
 * batch. The table's key identifies the record (its id, or its topic/partition/offset) and the
 * other columns are computed from the record alone, so a replayed record writes the row it
 * wrote before: the table after any number of replays is the table of one run.
 *
 * Protocol (one task, one partition of one real-time batch):
 *   1. open(partition, epoch): connect (autocommit), prepare the upsert.
 *   2. process(row): bind the row's values, execute; the row is committed and visible. A row
 *      the server refuses (SQLSTATE class 22 or 23: a value it cannot hold, a constraint of the
 *      table) is, when a rejects table was given (`rejectSql`), inserted there instead — keyed
 *      by the row's key (the whole row when a key value is null), `ON CONFLICT DO NOTHING`,
 *      autocommitted: a replayed refused row finds its reject already there. A connection error
 *      (SQLSTATE class 08, 57P01-57P03: the server restarting or unreachable) closes the
 *      connection, waits (50 ms doubling to 2 s), reconnects and runs the row's statements
 *      again, for up to `retryMillis`; then, or on any other error (a refused row without a
 *      rejects table), the task fails naming the row's key, and Spark's query fails: restarted
 *      on its checkpoint it replays from the last logged batch.
 *   3. close(error): the connection is closed; nothing is pending (every row was committed by
 *      its own statement).
 */
class UpsertWriter(
    url: String,
    user: String,
    password: String,
    sql: String,
    keyIndexes: Array[Int],
    retryMillis: Long,
    rejectSql: String) extends ForeachWriter[Row] {

  @transient private var conn: Connection = _
  @transient private var stmt: PreparedStatement = _
  @transient private var rejectStmt: PreparedStatement = _
  @transient private var epoch = -1L

  private def connect(): Unit = {
    val props = new Properties()
    if (user != null) props.setProperty("user", user)
    if (password != null) props.setProperty("password", password)
    conn = DriverManager.getConnection(url, props)
    conn.setAutoCommit(true)
    stmt = conn.prepareStatement(sql)
    if (rejectSql != null) rejectStmt = conn.prepareStatement(rejectSql)
  }

  private def disconnect(): Unit = {
    try { if (stmt != null) stmt.close() } catch { case _: SQLException => }
    try { if (rejectStmt != null) rejectStmt.close() } catch { case _: SQLException => }
    rejectStmt = null
    try { if (conn != null) conn.close() } catch { case _: SQLException => }
    stmt = null
    conn = null
  }

  override def open(partitionId: Long, epochId: Long): Boolean = {
    Class.forName("org.postgresql.Driver")
    epoch = epochId
    connect()
    true
  }

  private def bind(row: Row): Unit = {
    var i = 0
    while (i < row.length) {
      row.get(i) match {
        // instants as UTC offsets: the column is timestamptz, whatever the JVM's time zone
        case ts: Timestamp => stmt.setObject(i + 1, ts.toInstant.atOffset(ZoneOffset.UTC))
        case at: Instant => stmt.setObject(i + 1, at.atOffset(ZoneOffset.UTC))
        case v => stmt.setObject(i + 1, v)
      }
      i += 1
    }
  }

  private def transient(e: SQLException): Boolean = {
    val state = Option(e.getSQLState).getOrElse("")
    state.startsWith("08") || state == "57P01" || state == "57P02" || state == "57P03"
  }

  private def keyOf(row: Row): String = keyIndexes.map(i => String.valueOf(row.get(i))).mkString(", ")

  /** A value the server refused (class 22) or a constraint of the table (class 23). */
  private def refused(e: SQLException): Boolean = {
    val state = Option(e.getSQLState).getOrElse("")
    state.startsWith("22") || state.startsWith("23")
  }

  private def json(row: Row): String =
    if (row.schema != null) row.json else row.toSeq.map(String.valueOf).mkString("[", ", ", "]")

  /** The reject's `record`: the key's values as a JSON object (the whole row if one is null). */
  private def recordOf(row: Row): String = {
    if (row.schema == null || keyIndexes.exists(row.isNullAt)) return json(row)
    val fields = keyIndexes.map(row.schema.fields(_))
    json(new GenericRowWithSchema(keyIndexes.map(row.get), StructType(fields)))
  }

  /** The column or constraint the server named (PgJDBC's details, read without linking to it). */
  private def subjectOf(e: SQLException): String = try {
    val details = e.getClass.getMethod("getServerErrorMessage").invoke(e)
    if (details == null) null else {
      val named = Seq("getColumn", "getConstraint").map(m => details.getClass.getMethod(m).invoke(details))
      named.find(_ != null).map(String.valueOf).orNull
    }
  } catch { case _: ReflectiveOperationException => null }

  private def firstLine(e: SQLException): String =
    Option(e.getMessage).getOrElse("").linesIterator.toSeq.headOption.getOrElse("")

  private def reject(row: Row, e: SQLException): Unit = {
    rejectStmt.setString(1, recordOf(row))
    rejectStmt.setLong(2, epoch)
    rejectStmt.setString(3, json(row))
    rejectStmt.setString(4, "postgres")
    rejectStmt.setString(5, subjectOf(e))
    rejectStmt.setString(6, s"SQLSTATE ${e.getSQLState}: ${firstLine(e)}")
    try rejectStmt.executeUpdate() catch {
      case r: SQLException if !transient(r) =>
        throw new RuntimeException(
          s"the row with key (${keyOf(row)}) was refused by PostgreSQL (SQLSTATE ${e.getSQLState}: " +
            s"${firstLine(e)}) and its reject could not be written (SQLSTATE ${r.getSQLState}): ${firstLine(r)}", r)
    }
  }

  override def process(row: Row): Unit = {
    val deadline = System.currentTimeMillis() + retryMillis
    var wait = 50L
    var done = false
    while (!done) {
      try {
        if (conn == null) connect()
        bind(row)
        try stmt.executeUpdate() catch {
          case e: SQLException if rejectStmt != null && refused(e) => reject(row, e)
        }
        done = true
      } catch {
        case e: SQLException if transient(e) && System.currentTimeMillis() + wait < deadline =>
          disconnect()
          Thread.sleep(wait)
          wait = math.min(wait * 2, 2000L)
        case e: SQLException =>
          val hint = if (refused(e)) {
            "; to keep rows PostgreSQL refuses in a table and go on, pass rejects=\"<table>\" " +
              "to onceflow.write_realtime"
          } else ""
          throw new RuntimeException(
            s"onceflow's real-time upsert of the row with key (${keyOf(row)}) failed " +
              s"(SQLSTATE ${e.getSQLState}): ${e.getMessage}$hint", e)
      }
    }
  }

  override def close(errorOrNull: Throwable): Unit = disconnect()
}
