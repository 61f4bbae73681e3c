"""Running an exported model without torch: the generation contract shared by src.infer, the
benchmarks and export's checks; the MLflow pyfunc and the file MLflow builds it from. Imports
only what the logged model declares (onnxruntime, sentencepiece, numpy, pandas, mlflow)."""
