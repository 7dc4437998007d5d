#!/usr/bin/env python3
"""A TensorFlow trainer for a training cluster, written as for Vertex AI: unchanged for Augur.

It never sets its cluster up itself: `tf.distribute.MultiWorkerMirroredStrategy` reads the
`TF_CONFIG` that Augur writes for each replica (the chief is worker pool 0, the workers pool
1), and the replicas train one Keras model together, all-reducing their gradients every step.
The chief reports the validation loss with `cloudml-hypertune`; `BackupAndRestore` keeps a
checkpoint in AIP_CHECKPOINT_DIR every epoch, so a cluster retried after a crash resumes
there; the chief saves the model to AIP_MODEL_DIR (the others to scratch directories, as
multi-worker saving requires).

Needs `tensorflow-cpu` (or `tensorflow`), `tf-keras` and `cloudml-hypertune`
(`scripts/tf-venv.sh` installs them). The data is generated: y = sin(3·x1) + x2² + noise, so every replica makes the same set and
the strategy shards it.
"""
import argparse
import json
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
# tf.keras as Vertex AI's TensorFlow images have it (Keras 2, the `tf-keras` package): Keras 3's
# `fit` does not run under MultiWorkerMirroredStrategy.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import tensorflow as tf


def make_data(n=4096, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2)).astype("float32")
    y = (np.sin(3 * x[:, 0]) + x[:, 1] ** 2 + 0.05 * rng.normal(size=n)).astype("float32")
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--learning_rate", type=float, required=True)
    p.add_argument("--units", type=int, default=32)
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()

    tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    task = tf_config.get("task", {})
    print(f"TF_CONFIG task: {json.dumps(task)} cluster: {json.dumps(tf_config.get('cluster', {}))}", flush=True)
    # The tuning trial this replica belongs to, as Vertex AI sets it (a string: "7").
    trial = task["trial"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    chief = task.get("type", "chief") == "chief"
    print(f"strategy: {strategy.num_replicas_in_sync} replicas in sync; this is {task.get('type')} {task.get('index')} of trial {trial}", flush=True)

    x, y = make_data()
    split = int(0.8 * len(x))
    batch = 64 * strategy.num_replicas_in_sync
    train = tf.data.Dataset.from_tensor_slices((x[:split], y[:split])).shuffle(4096, seed=1).batch(batch).repeat()
    val = tf.data.Dataset.from_tensor_slices((x[split:], y[split:])).batch(batch)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input(shape=(2,)),
            tf.keras.layers.Dense(args.units, activation="relu"),
            tf.keras.layers.Dense(args.units, activation="relu"),
            tf.keras.layers.Dense(1),
        ])
        model.compile(optimizer=tf.keras.optimizers.Adam(args.learning_rate), loss="mse")

    callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "backup"))]
    if chief:
        # One measurement per epoch, from the chief: the trial's learning curve.
        import hypertune
        tuner = hypertune.HyperTune()

        class ReportEpoch(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                tuner.report_hyperparameter_tuning_metric(
                    hyperparameter_metric_tag="val_loss", metric_value=float(logs["val_loss"]),
                    global_step=epoch + 1)

        callbacks.append(ReportEpoch())
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=40, validation_data=val,
                        callbacks=callbacks, verbose=2)
    val_loss = float(history.history["val_loss"][-1])

    if chief:
        # The same last value on stdout, at the same step (not a second point of its own).
        print(f"epoch={args.epochs} val_loss={val_loss:.6g}", flush=True)
    # Every replica takes part in saving; only the chief's copy is kept.
    model_dir = os.environ["AIP_MODEL_DIR"] if chief else tempfile.mkdtemp()
    model.save(os.path.join(model_dir, "model.keras"))


if __name__ == "__main__":
    main()
