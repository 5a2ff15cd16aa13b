"""Hugging Face save_pretrained folders as checkpoints: tiny real ViT and BERT classifiers built
from configs and saved by transformers itself; numbers against the library's own forward."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from curvcal.errors import InputError, TrustError  # noqa: E402
from curvcal.load.checkpoint import load_model  # noqa: E402
from curvcal.load.checkpoints.inspect import inspect_checkpoint  # noqa: E402
from curvcal.settings.checkpoint import CheckpointSettings  # noqa: E402

LABELS = ("cat", "dog", "bird")


@dataclass(frozen=True)
class VitFiles:
    folder: Path
    data: Path
    x: torch.Tensor
    y: torch.Tensor


def _vit_config() -> object:
    return transformers.ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=3,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
        id2label=dict(enumerate(LABELS)),
        label2id={name: i for i, name in enumerate(LABELS)},
    )


@pytest.fixture(scope="module")
def vit(tmp_path_factory: pytest.TempPathFactory) -> VitFiles:
    root = tmp_path_factory.mktemp("vit")
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(_vit_config())
    # a non-trivial classifier, so that the Hessian is not close to zero
    with torch.no_grad():
        model.classifier.weight.normal_(0, 1.0)
    model.save_pretrained(root / "model")
    x = torch.randn(11, 3, 8, 8)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1])
    torch.save({"x": x, "y": y}, root / "images.pt")
    return VitFiles(root / "model", root / "images.pt", x, y)


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bert") / "model"
    torch.manual_seed(1)
    config = transformers.BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def _library_model(folder: Path) -> torch.nn.Module:
    # eager attention: the library's fused kernel has no forward-mode rule for the reference
    model = transformers.AutoModelForImageClassification.from_pretrained(
        folder, attn_implementation="eager"
    )
    return model.double().eval()


def _dense_hessian(folder: Path, x: torch.Tensor, y: torch.Tensor, prefix: str) -> torch.Tensor:
    """Dense Hessian of the mean cross-entropy over the parameters whose names start with
    ``prefix``, from the library's own forward (torch.func.hessian of a functional_call)."""
    model = _library_model(folder)
    chosen = {n: p.detach() for n, p in model.named_parameters() if n.startswith(prefix)}
    shapes = [(n, p.shape, p.numel()) for n, p in chosen.items()]
    flat = torch.cat([p.reshape(-1) for p in chosen.values()])

    def loss(vector: torch.Tensor) -> torch.Tensor:
        params, start = {}, 0
        for name, shape, count in shapes:
            params[name] = vector[start : start + count].reshape(shape)
            start += count
        out = torch.func.functional_call(model, params, args=(), kwargs={"pixel_values": x})
        return torch.nn.functional.cross_entropy(out.logits, y)

    return torch.func.hessian(loss)(flat)


def test_folder_logits_equal_the_library_forward(vit: VitFiles) -> None:
    loaded = load_model(vit.folder, CheckpointSettings(device="cpu", dtype="float64"))
    reference = _library_model(vit.folder)
    x = vit.x.double()
    with torch.no_grad():
        assert torch.equal(loaded.module(x), reference(pixel_values=x).logits)
    assert loaded.form == "hf_folder" and loaded.arch is None
    assert loaded.architecture == "ViTForImageClassification"
    assert loaded.labels == LABELS and loaded.num_classes == 3 and loaded.modality == "image"
    # the library's own parameter names, not a wrapper's
    names = [n for n, _ in loaded.module.named_parameters()]
    assert names == [n for n, _ in reference.named_parameters()]
    assert loaded.parameter_count == sum(p.numel() for p in reference.parameters())
    assert not loaded.module.training


def test_hessian_of_the_classifier_equals_the_dense_reference(run_cli, vit: VitFiles) -> None:
    dense = _dense_hessian(vit.folder, vit.x.double(), vit.y, "classifier.")
    exact = torch.linalg.eigvalsh(dense)
    args = ["hessian", vit.folder, "--data", vit.data, "--dtype", "float64", "--device", "cpu"]
    result = run_cli(
        *args, "--params", "classifier.*", "--top-k", "2", "--tol", "1e-10", "--no-trace", "--json"
    )
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    results = document["results"]
    assert results["lambda_max"] == pytest.approx(float(exact[-1].detach()), rel=1e-6)
    assert results["eigenvalues"] == pytest.approx(exact[-2:].flip(0).detach().tolist(), rel=1e-6)
    checkpoint = document["inputs"]["checkpoint"]
    assert checkpoint["architecture"] == "ViTForImageClassification"
    assert checkpoint["id2label"] == list(LABELS)
    assert checkpoint["form"] == "hf_folder" and checkpoint["size_bytes"] > 0


def test_hessian_of_every_parameter_equals_eigsh_on_the_library_forward(
    run_cli, vit: VitFiles
) -> None:
    from scipy.sparse.linalg import LinearOperator, eigsh

    model = _library_model(vit.folder)
    params = {n: p.detach() for n, p in model.named_parameters()}
    x = vit.x.double()

    def loss(values: dict[str, torch.Tensor]) -> torch.Tensor:
        out = torch.func.functional_call(model, values, args=(), kwargs={"pixel_values": x})
        return torch.nn.functional.cross_entropy(out.logits, vit.y)

    sizes = [p.numel() for p in params.values()]

    def hvp(vector: object) -> object:
        v = torch.as_tensor(vector, dtype=torch.float64).reshape(-1)
        tangent = dict(
            zip(
                params,
                [c.reshape(p.shape) for c, p in zip(v.split(sizes), params.values(), strict=True)],
                strict=True,
            )
        )
        _, product = torch.func.jvp(torch.func.grad(loss), (params,), (tangent,))
        return torch.cat([product[n].reshape(-1) for n in params]).numpy()

    total = sum(sizes)
    operator = LinearOperator((total, total), matvec=hvp, dtype="float64")
    (reference,) = eigsh(operator, k=1, which="LA", tol=1e-12, return_eigenvectors=False)
    result = run_cli(
        "hessian", vit.folder, "--data", vit.data, "--dtype", "float64", "--device", "cpu",
        "--tol", "1e-10", "--no-trace", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert json.loads(result.stdout)["results"]["lambda_max"] == pytest.approx(
        float(reference), rel=1e-6
    )


def test_calibrate_and_check_run_on_the_folder(run_cli, vit: VitFiles, tmp_path: Path) -> None:
    result = run_cli(
        "calibrate", vit.folder, "--data", vit.data, "--device", "cpu", "--method", "ts",
        "--val-split", "0.5", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    with torch.no_grad():
        logits = _library_model(vit.folder).float()(pixel_values=vit.x).logits
    document = json.loads(result.stdout)
    assert document["inputs"]["checkpoint"]["architecture"] == "ViTForImageClassification"
    policy = tmp_path / "gate.toml"
    policy.write_text(
        f'[settings]\ndata = "{vit.data}"\ndevice = "cpu"\nprobes = 4\ntol = 1e-3\n'
        "[accuracy]\nmin = 0.0\n[lambda_max]\nmax = 1e9\n"
    )
    result = run_cli("check", vit.folder, "--policy", policy, "--json")
    assert result.code == 0, result.stderr
    rows = json.loads(result.stdout)["results"]["rows"]
    (accuracy,) = [r for r in rows if r["metric"] == "accuracy"]
    expected = float((logits.argmax(1) == vit.y).double().mean())
    assert accuracy["value"] == pytest.approx(expected, abs=1e-12)


def test_inspect_reports_architecture_labels_and_parameter_count(run_cli, vit: VitFiles) -> None:
    info = inspect_checkpoint(vit.folder)
    reference = _library_model(vit.folder)
    assert info.format == "hf_folder" and info.container == "folder" and not info.needs_trust
    assert info.architecture == "ViTForImageClassification" and info.labels == LABELS
    assert info.parameter_count == sum(p.numel() for p in reference.parameters())
    assert info.num_classes == 3
    result = run_cli("inspect", vit.folder, "--json")
    assert result.code == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    assert results["architecture"] == "ViTForImageClassification"
    assert results["labels"] == list(LABELS)
    table = run_cli("inspect", vit.folder)
    assert "ViTForImageClassification" in table.stdout and "cat, dog, bird" in table.stdout


def test_a_state_dict_of_the_same_model_loads_with_arch_hf(vit: VitFiles, tmp_path: Path) -> None:
    reference = _library_model(vit.folder).float()
    # as DistributedDataParallel would save it
    state = {f"module.{k}": v for k, v in reference.state_dict().items()}
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "weights.pt")
    loaded = load_model(
        tmp_path / "weights.pt", CheckpointSettings(arch=f"hf:{vit.folder}", device="cpu")
    )
    with torch.no_grad():
        assert torch.equal(loaded.module(vit.x), reference(pixel_values=vit.x).logits)
    assert loaded.architecture == "ViTForImageClassification" and loaded.labels == LABELS
    assert loaded.stripped_prefix == "module."


def test_custom_code_is_refused_without_trust(run_cli, vit: VitFiles, tmp_path: Path) -> None:
    folder = tmp_path / "custom"
    shutil.copytree(vit.folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForImageClassification": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    info = inspect_checkpoint(folder)
    assert info.needs_trust and "modeling_evil.EvilModel" in info.metadata["custom_code"]
    with pytest.raises(TrustError):
        load_model(folder, CheckpointSettings(device="cpu"))
    result = run_cli("hessian", folder, "--data", vit.data, "--device", "cpu")
    assert result.code == 2
    line = result.stderr.strip().splitlines()[-1]
    assert str(folder) in line and "custom code" in line and "--trust-checkpoint" in line
    assert "Traceback" not in result.stderr


def test_a_text_classifier_loads_and_inspects(bert: Path) -> None:
    loaded = load_model(bert, CheckpointSettings(device="cpu"))
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(
        bert, attn_implementation="eager"
    ).eval()
    ids = torch.tensor([[2, 5, 7, 3, 0], [2, 9, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        assert torch.equal(loaded.module({"input_ids": ids, "attention_mask": mask}), expected)
    assert loaded.modality == "text" and loaded.labels == ("negative", "positive")
    info = inspect_checkpoint(bert)
    assert info.architecture == "BertForSequenceClassification"
    assert info.metadata["modality"] == "text"


def test_a_text_classifier_on_image_data_is_a_clear_input_error(
    run_cli, bert: Path, vit: VitFiles
) -> None:
    for command in ("hessian", "calibrate"):
        result = run_cli(command, bert, "--data", vit.data, "--device", "cpu")
        assert result.code == 2, result.output
        line = result.stderr.strip().splitlines()[-1]
        assert "text classifier" in line and "the data is not text" in line
        assert "Traceback" not in result.stderr


def test_missing_transformers_names_the_extra(run_cli, vit: VitFiles, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    result = run_cli("hessian", vit.folder, "--data", vit.data, "--device", "cpu")
    assert result.code == 2
    line = result.stderr.strip().splitlines()[-1]
    assert str(vit.folder) in line and "pip install 'curvcal[hf]'" in line


def test_bad_folders_are_input_errors(vit: VitFiles, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"has no config\.json"):
        load_model(empty, CheckpointSettings(device="cpu"))
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    shutil.copy(vit.folder / "config.json", no_weights / "config.json")
    with pytest.raises(InputError, match="no weights"):
        inspect_checkpoint(no_weights)
    broken = tmp_path / "broken"
    shutil.copytree(vit.folder, broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_model(broken, CheckpointSettings(device="cpu"))
    with pytest.raises(InputError, match="names its architecture"):
        load_model(vit.folder, CheckpointSettings(arch="tv:resnet18", device="cpu"))


def test_truncated_weights_name_the_weight_file(vit: VitFiles, tmp_path: Path) -> None:
    """A copy cut short (an interrupted download) is one error naming model.safetensors, before
    transformers reads it (whose own error names no file and was an internal error)."""
    cut = tmp_path / "cut"
    shutil.copytree(vit.folder, cut)
    weights = cut / "model.safetensors"
    for size in (20, weights.stat().st_size // 2):
        weights.write_bytes((vit.folder / "model.safetensors").read_bytes()[:size])
        with pytest.raises(InputError, match=r"cannot be read as a \.safetensors file") as info:
            load_model(cut, CheckpointSettings(device="cpu"))
        assert str(info.value).startswith(str(weights))


def test_study_runs_on_folders(run_cli, vit: VitFiles, tmp_path: Path) -> None:
    second = tmp_path / "second"
    torch.manual_seed(5)
    transformers.ViTForImageClassification(_vit_config()).save_pretrained(second)
    result = run_cli(
        "study", vit.folder, second, "--data", vit.data, "--device", "cpu", "--probes", "4",
        "--tol", "1e-3", "--gammas", "0,1", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    rows = document["results"]["rows"]
    assert len(rows) == 2 and all(r["curvature"]["lambda_max"] > 0 for r in rows)
    digests = [c["sha256"] for c in document["inputs"]["checkpoints"]]
    assert digests[0] != digests[1]  # the weights differ, names and sizes do not


def test_no_output_is_written_into_the_model_folder(run_cli, vit: VitFiles) -> None:
    before = sorted(p.name for p in vit.folder.iterdir())
    result = run_cli(
        "hessian", vit.folder, "--data", vit.data, "--device", "cpu", "-o", vit.folder / "r.json"
    )
    assert result.code == 2 and "lies inside the input folder CHECKPOINT" in result.stderr
    assert sorted(p.name for p in vit.folder.iterdir()) == before


def test_no_output_is_written_into_the_arch_folder(run_cli, vit: VitFiles, tmp_path: Path) -> None:
    torch.save(_library_model(vit.folder).float().state_dict(), tmp_path / "weights.pt")
    before = sorted(p.name for p in vit.folder.iterdir())
    result = run_cli(
        "calibrate",
        tmp_path / "weights.pt",
        "--arch",
        f"hf:{vit.folder}",
        "--data",
        vit.data,
        "--device",
        "cpu",
        "-o",
        vit.folder / "r.json",
    )
    assert result.code == 2 and "lies inside the input folder --arch" in result.stderr
    assert sorted(p.name for p in vit.folder.iterdir()) == before
