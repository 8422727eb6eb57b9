"""Java jars onceflow runs with, fetched from Maven Central into a local cache and checked.

Two sets, each pinned below with every jar's SHA-256:

* ``kafka-connector``: Spark's own Kafka connector (``spark-sql-kafka-0-10``) and the runtime
  jars it needs that pyspark does not ship (``spark-token-provider-kafka-0-10``,
  ``kafka-clients``, ``commons-pool2``). :func:`onceflow.session` with ``kafka=True``
  puts them on ``spark.jars``; :func:`onceflow.read_kafka` then reads with
  ``format("kafka")``. Maven Central has no connector built for pyspark 4.3 yet: the 4.2.0
  connector is pinned (its data source API is the one 4.3 runs; the tests run it on 4.3).
* ``postgres-jdbc``: PostgreSQL's JDBC driver (``org.postgresql:postgresql``; its runtime
  dependencies are annotations and Windows authentication, not needed), for the real-time
  upsert writer (:mod:`onceflow.api.realtime`), which runs in Spark's JVM.
* ``kafka-broker``: a Kafka broker (``kafka_2.13``, KRaft mode, no ZooKeeper) and its runtime
  dependencies, for tests, demos and ``onceflow verify --source kafka``
  (:class:`onceflow.verify.kafka_server.KafkaServer`); with Log4j 2's SLF4J 1.7 binding, so the
  broker logs (to ``broker.log``), and Kafka's own tools (``kafka-tools``: ``onceflow kafka-tool``).

Fetching a set (:func:`fetch`; ``onceflow jars fetch NAME``):

1. each pinned jar already in the set's directory (``$ONCEFLOW_JARS_DIR/<set>``, default
   ``~/.cache/onceflow/jars/<set>``) whose SHA-256 matches is kept;
2. a missing or different one is downloaded from Maven Central (``$ONCEFLOW_MAVEN_REPO`` names
   a mirror with Central's layout) into a temporary file in that directory;
3. its SHA-256 is checked against the pin: a mismatch deletes the file and fails, naming the jar;
4. the file is renamed into place; when every jar is in place a stamp file records the pins,
   so :func:`paths` answers without hashing the jars on every session start.

The pins were resolved with Maven (``mvn dependency:copy-dependencies -DincludeScope=runtime``
on ``org.apache.kafka:kafka_2.13:4.1.1``, and on the connector, keeping the jars pyspark lacks);
``kafka-tools`` without its ``connect-runtime`` dependency (the tools onceflow names need none of it).
"""

from __future__ import annotations

import os
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.runtime.files import file_sha256

CENTRAL = "https://repo.maven.apache.org/maven2"
"""Maven Central (``ONCEFLOW_MAVEN_REPO`` overrides it)."""

DIR_ENV = "ONCEFLOW_JARS_DIR"
REPO_ENV = "ONCEFLOW_MAVEN_REPO"
BROKER = "kafka-broker"
CONNECTOR = "kafka-connector"
POSTGRES_JDBC = "postgres-jdbc"
_STAMP = ".onceflow-verified"

_BROKER: tuple[tuple[str, str], ...] = (
    ("org.hdrhistogram:HdrHistogram:2.2.2",
     "22d1d4316c4ec13a68b559e98c8256d69071593731da96136640f864fa14fad8"),
    ("net.sourceforge.argparse4j:argparse4j:0.7.0",
     "65ceb669d88f63306c680f8088bbf765bbca72d288a61a03703000076c3d3f56"),
    ("com.github.ben-manes.caffeine:caffeine:3.2.0",
     "ec411dfdf0c03f25218648ce89861630b71680e5858a9a7278ebac8e55cab3d7"),
    ("commons-beanutils:commons-beanutils:1.9.4",
     "7d938c81789028045c08c065e94be75fc280527620d5bd62b519d5838532368a"),
    ("commons-collections:commons-collections:3.2.2",
     "eeeae917917144a68a741d4c0dff66aa5c5c5fd85593ff217bced3fc8ca783b8"),
    ("commons-digester:commons-digester:2.1",
     "e0b2b980a84fc6533c5ce291f1917b32c507f62bcad64198fff44368c2196a3d"),
    ("commons-logging:commons-logging:1.3.2",
     "6b858424f518015f32bfcd1183a373f4a827d72d026b6031da0c91cf0e8f3489"),
    ("commons-validator:commons-validator:1.9.0",
     "c3c14748e2d78db58df88808740711bd643b32c45ffa7b8a739f00fb467cd7d7"),
    ("com.dynatrace.hash4j:hash4j:0.22.0",
     "23028a3fd006e530bf495f551083208187cafd8f80624d048eba56442f16a50e"),
    ("com.fasterxml.jackson.core:jackson-annotations:2.19.0",
     "ead60e9cac0e42b57092b9e2d087ff43536e9477d4486ba393037a8cc156cda7"),
    ("com.fasterxml.jackson.core:jackson-core:2.19.0",
     "da8e859bac94874528116a25f20c68560e4287acbf27628711b8a4f96b028430"),
    ("com.fasterxml.jackson.core:jackson-databind:2.19.0",
     "ceda311f476c3b18e1d2b240c94e2dcb9c8d44e70f8afa9facab88bac4ddc03a"),
    ("com.fasterxml.jackson.dataformat:jackson-dataformat-csv:2.19.0",
     "bec1150426b0616bb488149b952b45a0dcb16d9416b017c38f6455ad9389bc68"),
    ("com.fasterxml.jackson.dataformat:jackson-dataformat-yaml:2.19.0",
     "46e54dcbd39d4d12cda18ec9276e7b888e08fc765ea0c77e71662306f0d4abc4"),
    ("com.fasterxml.jackson.datatype:jackson-datatype-jdk8:2.19.0",
     "04f1a3f9da8155995dd00098d6847cdb9b7af67f4a3028c94031eff017c8e3e5"),
    ("net.sf.jopt-simple:jopt-simple:5.0.4",
     "df26cc58f235f477db07f753ba5a3ab243ebe5789d9f89ecf68dd62ea9a66c28"),
    ("org.bitbucket.b_c:jose4j:0.9.6",
     "7314af50cde9c99e8eaf43eee617a23edcc6bb43036221064355094999d837ef"),
    ("org.jspecify:jspecify:1.0.0",
     "1fad6e6be7557781e4d33729d49ae1cdc8fdda6fe477bb0cc68ce351eafdfbab"),
    ("org.apache.kafka:kafka-clients:4.1.1",
     "00247122a572c3d3ae4eb60a50192a5811bc0181f51923d13018600f892e821d"),
    ("org.apache.kafka:kafka-coordinator-common:4.1.1",
     "2072fc1ce7e0505149bba22a463a5909a899c6235c4fa696f15c21194a7baf60"),
    ("org.apache.kafka:kafka-group-coordinator:4.1.1",
     "3eb5a673b69d5992cfa86c5436f39adbf4ce284046a4c999ec6af0a8e31c5589"),
    ("org.apache.kafka:kafka-group-coordinator-api:4.1.1",
     "3d1801d2329dcf7d273796a034d61e6c7e0f851f384d0afbdd3a2e6cbd17a968"),
    ("org.apache.kafka:kafka-metadata:4.1.1",
     "a689665751415b6456de1ecb013042cb7ba99ac68fd8c3e8bf28e098feb43218"),
    ("org.apache.kafka:kafka-raft:4.1.1",
     "4810c93d93d1935dd54de61c5ba130f501c7fe11bc49ccd3ee05ec857818a72a"),
    ("org.apache.kafka:kafka-server:4.1.1",
     "9f6aff422855491aad54326eca8d604163d6d3a6507cc48ffe3ce6de73caf79a"),
    ("org.apache.kafka:kafka-server-common:4.1.1",
     "207edecd8322cf6c13d76d84addea7fd0ec441dc8d698cf69df43210ccdc0a94"),
    ("org.apache.kafka:kafka-share-coordinator:4.1.1",
     "e6bec53428c77bf6579321836d482542a93575f7c08e860a26c9f2c7f6059dac"),
    ("org.apache.kafka:kafka-storage:4.1.1",
     "1f85b82853eaec0143efbef7e3a4d4be8929ff83a386326431e0c2d0a557e58c"),
    ("org.apache.kafka:kafka-storage-api:4.1.1",
     "8c0a712472185d706c6bf5ae24bf5d84a8e396fd4745c708e6146a415f7fa7f7"),
    ("org.apache.kafka:kafka-tools:4.1.1",
     "8a6939f310a61119cedaffc144119e9b2a374e32a7ec18f78e49ce5aeb71d6b0"),
    ("org.apache.kafka:kafka-tools-api:4.1.1",
     "542b08fe20cf872a2d866acdff61ea338b469219dc2ebfae727a1d9ea5737e1a"),
    ("org.apache.kafka:kafka-transaction-coordinator:4.1.1",
     "a261b5730ac9e3205df7af5d45180d851e9d5f729ce1275c67511a6f51f73755"),
    ("org.apache.kafka:kafka_2.13:4.1.1",
     "e89428126cc7630a802123ba27aac4442816840b66d60670226feaff65f24fd1"),
    ("org.apache.logging.log4j:log4j-api:2.24.3",
     "5b4a0a0cd0e751ded431c162442bdbdd53328d1f8bb2bae5fc1bbeee0f66d80f"),
    ("org.apache.logging.log4j:log4j-core:2.24.3",
     "7eb4084596ae25bd3c61698e48e8d0ab65a9260758884ed5cbb9c6e55c44a56a"),
    ("org.apache.logging.log4j:log4j-slf4j-impl:2.24.3",  # SLF4J 1.7's binding: the broker's logs
     "40dec251164d1576e000968cd02e56a1125f46b91fb694a06dfa168f1335da48"),
    ("org.lz4:lz4-java:1.8.0",
     "d74a3334fb35195009b338a951f918203d6bbca3d1d359033dc33edd1cadc9ef"),
    ("com.yammer.metrics:metrics-core:2.2.0",
     "6b7a14a6f34c10f8683f7b5e2f39df0f07b58c7dff0e468ebbc713905c46979c"),
    ("org.pcollections:pcollections:4.0.2",
     "2bbeef5797a241300c4f7513cd546239629ed7deda4fc0c31df90bb95f5f13ef"),
    ("com.google.re2j:re2j:1.8",
     "7b52c72156dd7f98b3237a5b35c1d34fba381b21048c89208913ad80a45dfbd7"),
    ("org.scala-lang:scala-library:2.13.16",
     "1ebb2b6f9e4eb4022497c19b1e1e825019c08514f962aaac197145f88ed730f1"),
    ("com.typesafe.scala-logging:scala-logging_2.13:3.9.5",
     "87a3017d3f43e6ace7566fe4c3d615134c6914ff871c8d64bb32ca1d996d0545"),
    ("org.scala-lang:scala-reflect:2.13.16",
     "fb49ccd9cac7464486ab993cda20a3c1569d8ef26f052e897577ad2a4970fb1d"),
    ("org.slf4j:slf4j-api:1.7.36",
     "d3ef575e3e4979678dc01bf1dcce51021493b4d11fb7f1be8ad982877c16a1c0"),
    ("org.yaml:snakeyaml:2.4",
     "ef779af5d29a9dde8cc70ce0341f5c6f7735e23edff9685ceaa9d35359b7bb7f"),
    ("org.xerial.snappy:snappy-java:1.1.10.7",
     "4c766cb3f855415ee734b2392949a0b6f12a60879334a74518deaf6270d32e36"),
    ("com.github.luben:zstd-jni:1.5.6-10",
     "b6c3237e24b8252a5a9c3a0e1ae30ef8f323412e74bd358548b7a9e527d676df"),
)

_CONNECTOR: tuple[tuple[str, str], ...] = (
    ("org.apache.commons:commons-pool2:2.13.1",
     "f77a5060d6936a9144023584232f9de3f2248f1abfe156e9d31795f18770674f"),
    ("org.apache.kafka:kafka-clients:3.9.2",
     "014b4ef36884478a932641818b080c36a8f8e2e92dc771e800c9d2694f4f83d8"),
    ("org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
     "64539c45e5d39f7ddb747312c239f38f5208d08c1a0ddf7d70beb2fbd9373705"),
    ("org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.2.0",
     "641c7947afc8aa1189e433b7c2d305293993c8691bc1c2062d6d4f513b12518c"),
)

_POSTGRES_JDBC: tuple[tuple[str, str], ...] = (
    ("org.postgresql:postgresql:42.7.14",
     "73914527305a40cce504b0d3d90b23caf565136912d607ae8ae7c5895512332c"),
)

SETS: dict[str, tuple[tuple[str, str], ...]] = {BROKER: _BROKER, CONNECTOR: _CONNECTOR,
                                                 POSTGRES_JDBC: _POSTGRES_JDBC}
"""Set name -> ``(group:artifact:version, sha256)`` of each jar."""


class JarFetchError(ConfigError):
    """A pinned jar could not be fetched, or what was fetched is not the pinned jar."""


def set_dir(name: str) -> Path:
    """The directory a set's jars live in.

    Raises:
        ConfigError: An unknown set name.
    """
    if name not in SETS:
        raise ConfigError(f"no jar set {name!r}: the sets are {', '.join(sorted(SETS))}")
    root = os.environ.get(DIR_ENV) or str(Path.home() / ".cache" / "onceflow" / "jars")
    return Path(root) / name


def _file_name(coords: str) -> str:
    _group, artifact, version = coords.split(":")
    return f"{artifact}-{version}.jar"


def _url(coords: str) -> str:
    group, artifact, version = coords.split(":")
    repo = (os.environ.get(REPO_ENV) or CENTRAL).rstrip("/")
    return f"{repo}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"


def _pins(name: str) -> str:
    return "\n".join(f"{c} {h}" for c, h in SETS[name]) + "\n"


def paths(name: str) -> list[Path] | None:
    """The set's jars when all are in place and were checked (no network, no hashing).

    Returns:
        The jar paths, or None when the set was not fetched (see :func:`fetch`).
    """
    where = set_dir(name)
    stamp = where / _STAMP
    try:
        if stamp.read_text(encoding="utf-8") != _pins(name):
            return None
    except OSError:
        return None
    jars = [where / _file_name(c) for c, _ in SETS[name]]
    return jars if all(j.is_file() for j in jars) else None


def fetch(name: str, progress: Callable[[str], None] | None = None) -> list[Path]:
    """Make every jar of a set present and checked (steps in the module docstring).

    Args:
        name: A set of :data:`SETS` (``kafka-connector``, ``kafka-broker``, ``postgres-jdbc``).
        progress: Called with one line per jar downloaded.

    Returns:
        The jar paths.

    Raises:
        JarFetchError: A download failed or a jar's SHA-256 differs from the pin.
    """
    done = paths(name)
    if done is not None:
        return done
    where = set_dir(name)
    where.mkdir(parents=True, exist_ok=True)
    out = []
    for coords, sha in SETS[name]:
        target = where / _file_name(coords)
        out.append(target)
        if target.is_file() and file_sha256(target) == sha:
            continue
        url = _url(coords)
        if progress is not None:
            progress(f"{name}: downloading {coords}")
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=where)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as fh, urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310
                while block := resp.read(1 << 20):
                    fh.write(block)
            got = file_sha256(tmp)
            if got != sha:
                raise JarFetchError(f"{coords} from {url} has SHA-256 {got}, not the pinned {sha}: "
                                    f"a mirror ({REPO_ENV}) serving another file, or a damaged download")
            os.replace(tmp, target)
        except OSError as exc:
            raise JarFetchError(f"cannot download {coords} from {url}: {exc}. Maven Central (or the "
                                f"mirror in {REPO_ENV}) must be reachable; or copy the jar there by hand "
                                f"({target})") from None
        finally:
            tmp.unlink(missing_ok=True)
    (where / _STAMP).write_text(_pins(name), encoding="utf-8")
    return out


def require(name: str) -> list[Path]:
    """The set's jars, or a clear error saying how to fetch them.

    Raises:
        ConfigError: The set was not fetched.
    """
    found = paths(name)
    if found is None:
        raise ConfigError(f"the {name} jars are not in {set_dir(name)}: fetch them once with "
                          f"'onceflow jars fetch {name}' (from Maven Central, checked by SHA-256)")
    return found


def with_jars(conf: dict[str, str], paths: list[Path]) -> dict[str, str]:
    """``conf`` with ``paths`` appended to its ``spark.jars`` (a new dict; ``conf`` unchanged)."""
    given = [j for j in conf.get("spark.jars", "").split(",") if j]
    return {**conf, "spark.jars": ",".join([*given, *(str(p) for p in paths)])}


def main(argv: list[str] | None = None) -> int:
    """``python -m onceflow.runtime.jars fetch NAME...``: fetch sets (used by the project's scripts)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "fetch":
        print(f"usage: python -m onceflow.runtime.jars fetch {'|'.join(sorted(SETS))} ...", file=sys.stderr)
        return 2
    for name in args[1:]:
        jars = fetch(name, progress=lambda line: print(line, file=sys.stderr))
        print(f"{name}: {len(jars)} jars in {set_dir(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
