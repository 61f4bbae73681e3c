// The tokenizer library reads model files from disk with fs in Node; the page hands it bytes.
export default {};
export const readFileSync = () => { throw new Error('no file system in the browser'); };
