"""The whole training state: pulled by joiners, checkpointed, averaged exactly at the job's end, saved as model.pt."""
