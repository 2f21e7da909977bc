//! `strftime` for the `strftime_now` template function, by hand so it needs no time crate
//! and no clock of its own (wasm32 has none): formats a given Unix time, in UTC.

const SECS_PER_DAY: u64 = 86_400;
const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
/// 1970-01-01 was a Thursday.
const WEEKDAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];

/// A UTC calendar time.
#[derive(Debug, PartialEq)]
struct DateTime {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Thursday, as `WEEKDAYS`.
    weekday: usize,
    /// 1..=366
    yday: u32,
}

fn is_leap(y: i64) -> bool {
    y.rem_euclid(4) == 0 && (y.rem_euclid(100) != 0 || y.rem_euclid(400) == 0)
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 → (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl DateTime {
    fn from_unix(secs: u64) -> DateTime {
        let days = (secs / SECS_PER_DAY) as i64;
        let rem = (secs % SECS_PER_DAY) as u32;
        let (year, month, day) = civil_from_days(days);
        const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUMULATIVE[month as usize - 1] + day + u32::from(month > 2 && is_leap(year));
        DateTime { year, month, day, hour: rem / 3600, minute: rem / 60 % 60, second: rem % 60, weekday: (days % 7) as usize, yday }
    }
}

/// Formats `secs` (Unix time, UTC) with C `strftime` specifiers: `%Y %y %m %d %e %H %I %M %S
/// %p %b %h %B %a %A %j %%`, glibc's `-` flag to drop padding (`%-d`); anything else is
/// copied through as glibc does.
pub fn format(fmt: &str, secs: u64) -> String {
    let t = DateTime::from_unix(secs);
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.next_if_eq(&'-').is_some();
        let num = |n: u32, width: usize| if unpadded { n.to_string() } else { format!("{n:0width$}") };
        let Some(spec) = chars.next() else {
            out.push('%');
            if unpadded {
                out.push('-');
            }
            break;
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        match spec {
            'Y' => out.push_str(&t.year.to_string()),
            'y' => out.push_str(&num(t.year.rem_euclid(100) as u32, 2)),
            'm' => out.push_str(&num(t.month, 2)),
            'd' => out.push_str(&num(t.day, 2)),
            'e' if unpadded => out.push_str(&t.day.to_string()),
            'e' => out.push_str(&format!("{:2}", t.day)),
            'H' => out.push_str(&num(t.hour, 2)),
            'I' => out.push_str(&num(hour12, 2)),
            'M' => out.push_str(&num(t.minute, 2)),
            'S' => out.push_str(&num(t.second, 2)),
            'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            'j' => out.push_str(&num(t.yday, 3)),
            'B' => out.push_str(MONTHS[t.month as usize - 1]),
            'b' | 'h' => out.push_str(&MONTHS[t.month as usize - 1][..3]),
            'A' => out.push_str(WEEKDAYS[t.weekday]),
            'a' => out.push_str(&WEEKDAYS[t.weekday][..3]),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_edges() {
        assert_eq!(format("%Y-%m-%d %H:%M:%S %a %j", 0), "1970-01-01 00:00:00 Thu 001");
        // 2024-02-29 (leap day) 13:05:09 UTC
        assert_eq!(format("%A %d %B %Y, %I:%M %p, day %j", 1_709_211_909), "Thursday 29 February 2024, 01:05 PM, day 060");
        // 2000-12-31 23:59:59: day 366 of a leap century year
        assert_eq!(format("%j %b %-d %e %y %%", 978_307_199), "366 Dec 31 31 00 %");
        assert_eq!(format("%-m/%-d %Q %", 978_307_199), "12/31 %Q %");
    }
}
