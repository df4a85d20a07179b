"""`celerity export-hf` (a run's checkpoint as a Hugging Face folder, multipliers folded in) and `celerity import-hf`
(such a folder, or a stock Llama or GPT-NeoX one, as a run directory). The library is `celerity_jax/hf/`."""

import argparse
import importlib.util

from celerity_jax.cli import options
from celerity_jax.errors import ConfigError


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("export-hf", help="write a run's checkpoint as a Hugging Face model folder")
    p.add_argument("--workdir", required=True, help="a run directory written by `celerity train`")
    p.add_argument("--step", type=int, metavar="S", help="a saved checkpoint's step (default: the newest)")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new or empty)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="the weights' dtype (default float32; bfloat16 halves the size and rounds every weight)")
    options.add_json_option(p, "what was written")
    p.set_defaults(func=export_command)

    p = subparsers.add_parser("import-hf", help="read a Hugging Face model folder (an export, or a stock Llama or "
                                                "GPT-NeoX) into a run directory for eval, sample and init_from")
    p.add_argument("--model", required=True, metavar="DIR", help="the Hugging Face model folder")
    p.add_argument("--out", required=True, metavar="DIR", help="the run directory to write (new or empty)")
    options.add_gin_options(p, required=False, file_help="gin file of the run that will start from the import "
                                                         "(TrainConfig.init_from): its recipe, data and monitor")
    options.add_json_option(p, "what was written")
    p.set_defaults(func=import_command)


def _need_safetensors(command: str) -> None:
    if importlib.util.find_spec("safetensors") is None:
        raise ConfigError(f"{command} needs safetensors; install the hf extra: pip install -e '.[hf]'")


def export_command(args: argparse.Namespace) -> int:
    _need_safetensors("export-hf")
    from celerity_jax.evaluate import loader, sampler
    from celerity_jax.hf import card, export, outdir

    outdir.check_empty(args.out, "--out")
    options.check_json(args.json)
    model = loader.load_model(args.workdir, args.step)
    # as trained (scanned layers, remat, ...), and as sample and eval run it: a mixture of experts drops nothing
    cfg = sampler.inference_config(loader.run_model_config(model.identity, args.workdir))
    summary = export.export(cfg, model.params, args.out, tokenizer=model.tokenizer, dtype=args.dtype,
                            run_lines=card.run_section(args.workdir, model.step, model.plan))
    summary = {"workdir": args.workdir, "step": model.step, **summary}
    if options.emit_json(args.json, summary):
        return 0
    print(f"wrote {args.out}: step {model.step} of {args.workdir} as {summary['class']} ({summary['dtype']}, "
          f"{summary['tensors']} tensors, {summary['bytes'] / 1e6:.1f} MB in {len(summary['weight_files'])} file(s))")
    return 0


def import_command(args: argparse.Namespace) -> int:
    _need_safetensors("import-hf")
    from celerity_jax.hf import importer

    options.check_json(args.json)
    summary = importer.import_folder(args.model, args.out, args.gin_file, args.gin_param)
    if options.emit_json(args.json, summary):
        return 0
    print(f"wrote {args.out}: the {summary['model_type']} model of {args.model} as a run directory (checkpoint at "
          f"step 0, {summary['n_params']:,} parameters, tokenizer {summary['tokenizer']}); sample or evaluate it "
          f"with --workdir {args.out}, or train from it with TrainConfig.init_from = '{args.out}' and --gin-file "
          f"{args.out}/model.gin")
    return 0
