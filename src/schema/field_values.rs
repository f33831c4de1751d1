//! Value containers keyed by the device field table: one tick's values of a device
//! ([`FieldValues`]) and the JSON report of them or of a window ([`FieldReport`], whole or
//! fractional as each row says), serialised under the rows' keys in table order.

use std::fmt;

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::device::{DeviceField, FieldSpec, WindowKind, DEVICE_FIELDS, FIELD_COUNT};

/// One tick's value of every field of one device; `None` where NVML gave nothing.
#[derive(Clone, Copy, Default, PartialEq)]
pub struct FieldValues([Option<f64>; FIELD_COUNT]);

impl FieldValues {
    pub fn get(&self, field: DeviceField) -> Option<f64> {
        self.0[field as usize]
    }

    pub(crate) fn set(&mut self, field: DeviceField, value: Option<f64>) {
        self.0[field as usize] = value;
    }

    /// Every field with its value, in table order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static FieldSpec, Option<f64>)> + '_ {
        DEVICE_FIELDS.iter().zip(self.0.iter().copied())
    }
}

impl fmt::Debug for FieldValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().filter_map(|(s, v)| Some((s.key, v?))))
            .finish()
    }
}

/// Serialises as the report keys, each value whole or fractional as the field is.
impl Serialize for FieldValues {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        FieldReport::of_values(self).serialize(serializer)
    }
}

/// Every field's value as a JSON report shows it, serialised as a map under the table's
/// keys in table order (`null` where unknown).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldReport(pub [ReportValue; FIELD_COUNT]);

impl FieldReport {
    /// One tick's values as NVML gave them.
    pub(crate) fn of_values(values: &FieldValues) -> Self {
        Self(std::array::from_fn(|i| {
            ReportValue::sampled(&DEVICE_FIELDS[i], values.0[i])
        }))
    }

    /// The reported value of a field, `None` when unknown.
    pub(crate) fn get(&self, field: DeviceField) -> Option<f64> {
        match self.0[field as usize] {
            ReportValue::Whole(v) => Some(v as f64),
            ReportValue::Fraction(v) => Some(v),
            ReportValue::Unknown => None,
        }
    }
}

impl Serialize for FieldReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_keyed(serializer, DEVICE_FIELDS.iter().map(|s| s.key), &self.0)
    }
}

/// Serialises `values` as a map under `keys` (a table's keys, in its order).
pub(crate) fn serialize_keyed<S: Serializer, T: Serialize>(
    serializer: S,
    keys: impl Iterator<Item = &'static str>,
    values: &[T],
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(values.len()))?;
    for (key, value) in keys.zip(values) {
        map.serialize_entry(key, value)?;
    }
    map.end()
}

/// A field's value in a JSON report: whole fields as integers, `null` when unknown.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReportValue {
    Whole(u64),
    Fraction(f64),
    Unknown,
}

impl ReportValue {
    /// A sampled value: a rate stays fractional; whole quantities are rounded.
    pub(crate) fn sampled(spec: &FieldSpec, value: Option<f64>) -> Self {
        match value.filter(|v| v.is_finite()) {
            None => Self::Unknown,
            Some(v) if spec.whole && spec.window != WindowKind::IntegratedRate => {
                Self::Whole(v.round().max(0.0) as u64)
            }
            Some(v) => Self::Fraction(v),
        }
    }
}

impl Serialize for ReportValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match *self {
            Self::Whole(v) => serializer.serialize_u64(v),
            Self::Fraction(v) => serializer.serialize_f64(v),
            Self::Unknown => serializer.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_serialise_under_their_keys_whole_or_fractional() {
        let mut v = FieldValues::default();
        v.set(DeviceField::MemoryUsed, Some(1024.0));
        v.set(DeviceField::Power, Some(212.5));
        v.set(DeviceField::PcieTx, Some(1536.5));
        let json = serde_json::to_value(v).unwrap();
        assert_eq!(json["memory_used_bytes"], serde_json::json!(1024));
        assert!(json["memory_used_bytes"].is_u64());
        assert_eq!(json["power_watts"], 212.5);
        assert_eq!(json["pcie_tx_bytes_per_second"], 1536.5);
        assert!(json["temperature_celsius"].is_null());
        assert_eq!(json.as_object().unwrap().len(), FIELD_COUNT);
    }
}
