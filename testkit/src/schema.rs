//! `docs/job.schema.json`, the job contract, as the tests check real jobs
//! against it.

use serde_json::Value;

/// The schema, as JSON.
pub fn job_schema() -> Value {
    let text = std::fs::read_to_string(crate::root().join("docs/job.schema.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A validator for `schema` that asserts formats (date-time), not only
/// annotates them.
pub fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .unwrap()
}

/// Every job in `written` validates, and reads back as the one job type
/// to the same JSON.
pub fn assert_valid_jobs(validator: &jsonschema::Validator, written: &[Value]) {
    for job in written {
        let errors: Vec<String> = validator.iter_errors(job).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{job}: {errors:?}");
        let read = quota_gate::rules::job::ScanJob::from_json(&job.to_string()).unwrap();
        assert_eq!(
            &serde_json::to_value(&read).unwrap(),
            job,
            "read back the same"
        );
    }
}
