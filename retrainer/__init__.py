"""The programs between training and the service: the retrainer (`python -m retrainer`, a long-running
process that starts warm retrains by itself), one warm retrain end to end (`python -m retrainer.retrain`)
and the live-history export a retrain trains on (`python -m retrainer.export_history`). They read the
service's store and artifacts and run training jobs as child processes; they import neither training
nor the service's HTTP side."""
