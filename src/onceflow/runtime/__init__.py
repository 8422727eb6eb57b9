"""Spark's runtime: the session, Java, onceflow's jars and JVM parts.

:mod:`~onceflow.runtime.session` (a SparkSession with onceflow's defaults),
:mod:`~onceflow.runtime.connect` (what a Spark Connect server must have),
:mod:`~onceflow.runtime.driverjvm` (a driver JVM onceflow did not start: spark-submit),
:mod:`~onceflow.runtime.java`, :mod:`~onceflow.runtime.jvmstart` (a quick JVM start),
:mod:`~onceflow.runtime.jars` (jars fetched from Maven Central), :mod:`~onceflow.runtime.scalac`
(``jvm/*.scala`` compiled with PySpark's Scala compiler), :mod:`~onceflow.runtime.idstore` (the
id state store), :mod:`~onceflow.runtime.plans` (what onceflow reads of a DataFrame's plan,
classic or Connect) and :mod:`~onceflow.runtime.files` (durable local files).

Imports one way: ``runtime`` may import ``checkpoint``.
"""
