"""`celerity prepare-data --runner beam`: the same preparation as `prepare`, as an Apache Beam pipeline.

The driver plans the tasks (`corpus.plan_tasks`); the pipeline tokenizes them (`corpus.tokenize_task`), sums
their token counts into the group boundaries (`prepare.cut_groups` over the counts in task order), gathers
each group's results, writes its shards (`arrayrecord.write_group`) and finally writes manifest.json
(`prepare.write_manifest`) from the groups' shard entries and read counts, taken in task order. Same task
plan, same grouping rule over the same counts, same writer: the folder is byte-identical to the local
runner's with the same settings, whatever ran the work and in which order.

Where it runs: on this machine with the DirectRunner (the default), or on a cluster through Beam options after
`--` (e.g. `-- --runner=FlinkRunner ...` or `--runner=DataflowRunner ...`; the workers need celerity_jax
installed). Files are read and written with local file I/O (ArrayRecord writes local files only): the inputs
and --out must be at the same paths for the driver and every worker, on a shared or mounted filesystem (NFS,
gcsfuse). --out is built in the hidden folder beside it and renamed when complete.

Not resumable: the runner retries failed work itself, and a failed run removes its folder. A leftover folder
of a stopped local run is refused, not overwritten: finish it with --runner local, or delete it.
"""

import bisect
import contextlib
import json
import logging
import os
import pathlib
import shutil

from celerity_jax.data import arrayrecord, corpus, prepare
from celerity_jax.data.config import DataConfig
from celerity_jax.errors import ConfigError

BEAM_STEP_NOTE = " [while running '"


def tokenize(task: corpus.Task, cfg: DataConfig) -> corpus.TaskResult:
    """`corpus.tokenize_task` with the task first: beam.Map passes the element as the first argument."""
    return corpus.tokenize_task(cfg, task)


def group_starts(counts: list[tuple[int, int]], shard_tokens: int) -> list[int]:
    """The first task of each shard group, from every task's (index, token count)."""
    return [start for start, _ in prepare.cut_groups((n for _, n in sorted(counts)), shard_tokens)]


def key_by_group(result: corpus.TaskResult, starts: list[int]) -> tuple[int, corpus.TaskResult]:
    return bisect.bisect_right(starts, result.index) - 1, result


def write_shards(group_results, folder: str, ident: dict) -> tuple[int, dict, corpus.ReadReport]:
    """Writes one group's shards; returns (group, {split: shard entry}, what its tasks read)."""
    group, results = group_results
    return group, *prepare.write_shard_group(pathlib.Path(folder), group, sorted(results, key=lambda r: r.index),
                                             ident)


def gather_groups(groups: list, folder: str, ident: dict, cfg: DataConfig) -> None:
    """Writes manifest.json from every group's shards and read counts, in group order, as `prepare` does."""
    report = corpus.ReadReport()
    shards: dict[str, list[dict]] = {s: [] for s in corpus.SPLITS}
    for _, group_shards, group_report in sorted(groups, key=lambda g: g[0]):
        for split, entry in group_shards.items():
            shards[split].append(entry)
        report.merge(group_report)
    prepare.write_manifest(cfg, pathlib.Path(folder), ident, report, shards)


def config_error_in(error: BaseException) -> ConfigError | None:
    """The ConfigError a transform raised, found in the runner's exception chain or message, without the step
    name Beam appends to it."""
    seen = error
    while seen is not None and not isinstance(seen, ConfigError):
        seen = seen.__cause__ or seen.__context__
    if seen is not None:
        text = str(seen)
    elif "ConfigError: " in str(error):  # a runner that passes on only the worker's traceback as text
        text = str(error).rsplit("ConfigError: ", 1)[1].splitlines()[0]
    else:
        return None
    return ConfigError(text.split(BEAM_STEP_NOTE)[0])


@contextlib.contextmanager
def log_level(logger: logging.Logger, level: int):
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


def prepare_with_beam(cfg: DataConfig, out_dir: str, *, chunk_tokens: int, shard_tokens: int,
                      beam_options: list[str]) -> dict:
    """Tokenizes the documents of `cfg` into the shard folder `out_dir` with a Beam pipeline run with
    `beam_options`; returns its manifest."""
    try:
        with log_level(logging.getLogger(), logging.ERROR):  # Beam warns on import of GCP libraries it lacks
            import apache_beam as beam
            from apache_beam.options.pipeline_options import PipelineOptions
    except ImportError:
        raise ConfigError("the Beam runner needs Apache Beam: pip install 'celerity_jax[beam]' (or pip install "
                          "apache-beam), or use --runner local") from None
    prepare.check_sizes(chunk_tokens, shard_tokens)
    prepare.check_out(out_dir)
    files = corpus.input_files(cfg)  # bad paths and tokenizers fail here, before anything is created
    tasks = corpus.plan_tasks(files)
    ident = prepare.identity(cfg, files, tasks, chunk_tokens, shard_tokens)
    work = prepare.partial_folder(out_dir)
    if os.path.isdir(work) and os.listdir(work):
        raise ConfigError(f"{work} holds an unfinished prepare-data, which a Beam run cannot resume; finish it with "
                          "--runner local (same arguments), or delete it")
    os.makedirs(work, exist_ok=True)
    lock = prepare.lock_folder(work)  # keeps a local run from resuming into this folder meanwhile
    try:
        # The runner logs a transform's error with its traceback, then raises it here to be reported once.
        with log_level(logging.getLogger("apache_beam.runners.common"), logging.CRITICAL), \
                beam.Pipeline(options=PipelineOptions(beam_options)) as pipeline:
            results = pipeline | "Tasks" >> beam.Create(tasks) | "Tokenize" >> beam.Map(tokenize, cfg)
            starts = (results
                      | "TokenCounts" >> beam.Map(lambda result: (result.index, result.n_tokens))
                      | "AllCounts" >> beam.combiners.ToList()
                      | "GroupStarts" >> beam.Map(group_starts, shard_tokens))
            (results
             | "KeyByGroup" >> beam.Map(key_by_group, beam.pvalue.AsSingleton(starts))
             | "GroupResults" >> beam.GroupByKey()
             | "WriteShards" >> beam.Map(write_shards, work, ident)
             | "AllGroups" >> beam.combiners.ToList()
             | "WriteManifest" >> beam.Map(gather_groups, work, ident, cfg))
    except BaseException as e:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(e, ConfigError) and BEAM_STEP_NOTE not in str(e):
            raise  # the driver's own
        error = config_error_in(e)
        if error is None:
            raise
        raise error from e
    finally:
        os.close(lock)
    prepare.rename_into_place(work, out_dir)
    with open(os.path.join(out_dir, arrayrecord.MANIFEST)) as f:
        return json.load(f)
