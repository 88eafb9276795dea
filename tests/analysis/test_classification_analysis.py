"""Per-class analysis against scikit-learn, on real predictions: a logistic regression trained on 6x6 thumbnails
of the digits JPEG tree (10 classes, 60 val images, a few of them misclassified)."""
import json
import os

import numpy as np
import pytest
from PIL import Image
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import classification_report, confusion_matrix

from ppdlx.analysis import classification_analysis, classification_metrics
from ppdlx.data.image_folder import scan_image_folder
from tests.conftest import make_digits_tree


def thumbnails(root, split):
    classes, samples = scan_image_folder(os.path.join(root, split))
    features = np.stack([np.asarray(Image.open(p).convert("L").resize((6, 6), Image.BILINEAR), np.float32).ravel()
                         / 255.0 for p, _ in samples])
    return features, np.asarray([label for _, label in samples]), [p for p, _ in samples], classes


@pytest.fixture(scope="module")
def predictions(tmp_path_factory):
    root = make_digits_tree(tmp_path_factory.mktemp("digits") / "digits", per_class=30, classes=10)
    x_train, y_train, _, names = thumbnails(root, "train")
    x_val, y_val, paths, _ = thumbnails(root, "val")
    model = LogisticRegression(max_iter=500).fit(x_train, y_train)
    probs = model.predict_proba(x_val)
    assert (probs.argmax(1) != y_val).sum() >= 2, "the fixture needs some errors to analyse"
    return {"labels": y_val, "probs": probs, "logits": model.decision_function(x_val), "paths": paths,
            "names": names}


def test_per_class_numbers_equal_scikit_learn(predictions):
    p = predictions
    result = classification_metrics(p["labels"], p["probs"], p["names"], p["paths"])
    preds = p["probs"].argmax(1)
    reference = classification_report(p["labels"], preds, labels=list(range(10)), target_names=p["names"],
                                      output_dict=True, zero_division=0)
    for name in p["names"]:
        ours, theirs = result["per_class"][name], reference[name]
        assert (ours["precision"], ours["recall"], ours["f1"], ours["support"]) == \
            (theirs["precision"], theirs["recall"], theirs["f1-score"], theirs["support"])
    for average in ("macro avg", "weighted avg"):
        assert result[average]["f1"] == pytest.approx(reference[average]["f1-score"], abs=1e-12)
        assert result[average]["precision"] == pytest.approx(reference[average]["precision"], abs=1e-12)
    assert result["accuracy"] == pytest.approx(reference["accuracy"], abs=1e-12)
    matrix = confusion_matrix(p["labels"], preds, labels=list(range(10)))
    assert result["confusion_matrix"] == matrix.tolist()
    # the most confused-with class is the largest off-diagonal entry of the row
    for k, name in enumerate(p["names"]):
        row = matrix[k].copy()
        row[k] = 0
        assert result["per_class"][name]["confused"] == row.max()
    # errors: every misclassified image, most confident first, with its true and predicted names
    wrong = np.flatnonzero(preds != p["labels"])
    assert result["errors"] == len(wrong)
    confidences = [e["confidence"] for e in result["most_confident_errors"]]
    assert confidences == sorted(p["probs"][wrong, preds[wrong]], reverse=True)
    first = result["most_confident_errors"][0]
    i = first["index"]
    assert first["path"] == p["paths"][i] and first["true"] == p["names"][p["labels"][i]]
    assert first["pred"] == p["names"][preds[i]] != first["true"]


def test_logits_give_the_same_analysis_as_probabilities(predictions):
    p = predictions
    from_probs = classification_metrics(p["labels"], p["probs"], p["names"])
    from_logits = classification_metrics(p["labels"], p["logits"], p["names"])
    assert from_logits["per_class"] == from_probs["per_class"]
    assert from_logits["confusion_matrix"] == from_probs["confusion_matrix"]
    with pytest.raises(ValueError, match=r"expected \(60, 9\)"):
        classification_metrics(p["labels"], p["probs"], p["names"][:9])


def test_files_tables_and_figures(predictions, tmp_path):
    pytest.importorskip("matplotlib")
    p = predictions
    result = classification_analysis(p["labels"], p["probs"], p["paths"], p["names"], str(tmp_path), top_errors=3)
    assert sorted(result["files"]) == ["analysis.md", "confusion.png", "errors.png"]
    md = (tmp_path / "analysis.md").read_text()
    c = result["per_class"]["0"]
    assert f"| 0 | {c['precision']:.4f} | {c['recall']:.4f} | {c['f1']:.4f} | {c['support']} |" in md
    assert md.count(p["paths"][result["most_confident_errors"][0]["index"]]) == 1
    with Image.open(tmp_path / "confusion.png") as img:
        assert img.size == (130 + 10 * 48 + 110, 50 + 10 * 48 + 110)  # margins + 48 px per class
        assert np.asarray(img.convert("L"), np.float32).var() > 100.0
    with Image.open(tmp_path / "errors.png") as img:
        assert img.size == (3 * 150, 60 + 170)  # 3 errors in one row under a 60 px title
        assert np.asarray(img.convert("L"), np.float32).var() > 100.0
    assert len(result["most_confident_errors"]) == 3
    assert json.loads(json.dumps(result)) == result  # the eval --report content
