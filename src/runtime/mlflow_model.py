"""The file MLflow builds the served model from ("models from code"): nothing is pickled, so
a model logged by one version of Python or MLflow loads in another. See src/runtime/serving.py."""

from mlflow.models import set_model

from src.runtime.serving import TranslationModel

set_model(TranslationModel())
